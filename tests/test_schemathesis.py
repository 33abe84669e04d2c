"""schemathesis over the OpenAPI document, against a real `agentstate serve` on each backend.

One test per operation and backend, generated from the document the application builds (so
a new endpoint is fuzzed without touching this file). Every response must pass:
no server error, a declared status, a declared content type, a body that matches the declared
schema, and the declared response headers. The server runs on a fresh database of its own, so
what a run finds does not depend on the other tests (and `derandomize` makes it repeat).
Beyond the issue's three (server errors, response schemas, undocumented statuses and content
types) the document must tell the truth about what is accepted, authenticated and allowed.

The budget is `AGENTSTATE_FUZZ_EXAMPLES` generated cases per operation and phase (default 25:
about 85 s per backend on the shared 2-core machine); `docs/testing.md` says how to run more.
Strings are generated without U+0000 (the API refuses it in every string, as documented).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from app.core.secretbox import new_key
from app.core.settings import Settings
from app.main import create_app
from tests.conftest import migrated_database
from tests.support import ServerProcess

BUDGET = int(os.environ.get("AGENTSTATE_FUZZ_EXAMPLES", "25"))
# Every check that judges one response (the stateful-only ones need the stateful phase): the
# issue's three (server errors, response schemas, undocumented statuses and content types),
# the declared headers, and the document telling the truth about what is accepted.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance, negative_data_rejection,
          positive_data_acceptance, missing_required_header, ignored_auth, unsupported_method,
          allow_header_conformance]

CONFIG = schemathesis.Config.from_dict({
    # Strings with U+0000 are refused everywhere (Postgres cannot store them): 422, by design.
    "generation": {"allow-x00": False, "codec": "utf-8", "database": "none"},
    "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True},
               "fuzzing": {"enabled": True}, "stateful": {"enabled": False}},
    # Refusals of schema-valid requests that no schema can express, allowed as schemathesis
    # documents (ST202 "an unknown id or a cross-field rule"): 400 a cursor this list never
    # handed out (cursors are opaque); 410/412/428 a precondition judged against the stored
    # revision; 422 a rule on stored data (a revision outside the kept history, a compaction
    # of messages that are not a contiguous live run); 406 the event stream, which the
    # fuzzer asks for as JSON (`Accept: application/json`, below: a stream never ends).
    # Server errors stay failures (not_a_server_error), and so do 413/415 and anything
    # undeclared.
    "checks": {"positive_data_acceptance": {"expected-statuses": [
        "2xx", "3xx", "400", "401", "403", "404", "406", "409", "410", "412", "422", "428",
        "429"]},
               # Schema-violating data is rejected with schemathesis's own list, and with 414
               # when the fuzzer's invalid values make the URI longer than the server reads
               # (a declared answer of every operation with query parameters).
               "negative_data_rejection": {"expected-statuses": [
                   "400", "401", "403", "404", "405", "406", "409", "414", "415", "422",
                   "428", "429", "5xx"]}},
})


def document() -> dict:
    return create_app(Settings(database_url="sqlite+aiosqlite:///:memory:",  # type: ignore[call-arg]
                               auto_migrate=False, _env_file=None)).openapi()


schema = schemathesis.openapi.from_dict(document(), config=CONFIG)

@pytest.fixture(scope="module")
def fuzzed_server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    backend = "sqlite" if database_url.startswith("sqlite") else "postgres"
    # Long polls (`?wait=`) answer within 0.1 s here, so fuzzing them stays in budget. A key
    # for MCP secrets, which SQLite's embedded default makes itself and Postgres does not:
    # without one, MCP servers with secrets are 503 secrets_not_configured, as documented.
    env = {"AGENTSTATE_EVENTS_MAX_WAIT_SECONDS": "0.1", "AGENTSTATE_SECRET_KEYS": new_key()}
    with migrated_database(backend, tmp_path_factory) as url, ServerProcess(
            url, env=env) as server:
        yield server.base_url


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=BUDGET, derandomize=True, database=None, deadline=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_openapi_contract(case: schemathesis.Case, fuzzed_server: str, backend: str) -> None:
    # The stream answers `*/*` (the fuzzer's Accept) with a response that never ends: its
    # parameters are fuzzed with an Accept that excludes it, which is answered at once.
    headers = {"Accept": "application/json"} if case.path == "/v1/events/stream" else None
    case.call_and_validate(base_url=fuzzed_server, checks=CHECKS, headers=headers)
