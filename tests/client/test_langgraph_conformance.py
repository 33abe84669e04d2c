"""langgraph-checkpoint-conformance against `AgentStateSaver` over HTTP, against a real server
process on SQLite and on Postgres: every one of the 8 capabilities must be detected and pass."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from agentstate_client.langgraph import AgentStateSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from tests.support import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_all_eight_capabilities_pass(server: ServerProcess) -> None:
    savers: list[AgentStateSaver] = []

    @checkpointer_test(name=f"AgentStateSaver[{server.base_url}]")
    async def saver() -> AsyncIterator[AgentStateSaver]:
        made = AgentStateSaver(base_url=server.base_url)
        savers.append(made)
        yield made
        await made.aclose()
        made.close()

    report = await validate(saver)
    report.print_report()
    results = {name: (result.detected, result.passed, result.failures)
               for name, result in report.results.items()}
    assert set(results) == {capability.value for capability in Capability}
    assert len(results) == 8
    failed = {name: r for name, r in results.items() if not (r[0] and r[1] is True)}
    assert not failed, f"capabilities not detected or failing: {failed}"
    assert all(report.results[name].tests_failed == 0 and report.results[name].tests_skipped == 0
               for name in results)
    assert len(savers) == 8
