"""The README's promises: its walkthrough runs as pasted, its settings table is complete."""

from __future__ import annotations

import json
import re
import subprocess

import httpx
import pytest

from app.core.settings import Settings
from tests.support import ROOT, ServerProcess

README = (ROOT / "README.md").read_text()


def fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.DOTALL)


# Commands a shell finds only with the venv active, or in an environment nobody named.
VENV_ONLY = {"agentstate", "pip", "pip3", "python", "st", "alembic", "pytest", "mypy", "ruff"}


def pasted(block: str, database_url: str, env: dict[str, str] | None = None) -> str:
    """What a README block prints when pasted against a fresh `agentstate serve` (its
    `localhost:8080` is that server's address); it must exit 0."""
    with ServerProcess(database_url, env=env) as server:
        script = block.replace("localhost:8080", f"127.0.0.1:{server.port}")
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                                text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_command_runs_from_the_repository_root() -> None:
    """After the first command (which makes .venv), every command the README shows, in a
    block or inline, is paste-able from the repository root: the CLI, pip and python are
    `.venv/bin/...`, never a bare `agentstate` (not found unless the venv is active) or a
    `pip` of some other environment."""
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", README, flags=re.DOTALL))
    commands = []
    for snippet in [*fenced("sh"), *inline]:
        for line in snippet.splitlines():
            line = re.sub(r"(^|\s)#.*", "", line)  # a comment
            commands += [part.split() for part in re.split(r"&&|\|\||;|\|", line)]
    bare = [" ".join(words) for words in commands if words and (
        words[0] in VENV_ONLY or (words[0] == "python3" and words[1:3] != ["-m", "venv"]))]
    assert not bare, bare
    assert any(words[:1] == [".venv/bin/agentstate"] for words in commands)


def test_settings_table_lists_every_setting() -> None:
    documented = set(re.findall(r"^\| `((?:AGENTSTATE|OTEL)_[A-Z_]+)` \|", README,
                                flags=re.MULTILINE))
    # OpenTelemetry's own variables are read under their own names (validation_alias).
    assert documented == {
        field.validation_alias.upper() if isinstance(field.validation_alias, str)
        else f"AGENTSTATE_{name.upper()}" for name, field in Settings.model_fields.items()}


@pytest.mark.slow
@pytest.mark.parametrize("backend_marker", ["any"])
def test_curl_walkthrough_runs_as_pasted(database_url: str, backend_marker: str) -> None:
    out = pasted(next(block for block in fenced("sh") if "T=demo-$RANDOM" in block),
                 database_url)
    statuses = re.findall(r"^HTTP/1.1 (\d{3})", out, flags=re.MULTILINE)
    assert statuses == ["201", "200", "412", "428", "200", "304"], out
    assert '"code":"revision_mismatch","current_revision":2' in out
    assert '"state":{"agent":"planner","step":3}' in out
    assert '"has_more":' in out and '"team":"research"' in out


@pytest.mark.slow
def test_messages_agent_states_and_audit_examples_run_as_pasted(database_url: str) -> None:
    blocks = [b for b in fenced("sh") if "C=chat-$RANDOM" in b or "S=session-$RANDOM" in b
              or "/v1/events?thread_id=$S" in b]
    assert len(blocks) == 3
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()  # the embedded default makes its own; this URL is explicit
    out = pasted("\n".join(blocks), database_url, {"AGENTSTATE_SECRET_KEYS": key})
    assert re.findall(r"HTTP/1.1 (\d{3})", out) == ["201", "200"]
    assert '"seq":1' in out and '"seq":2' in out and '"thread_revision":2' in out
    assert '"source_message_ids":["m1","m2"]' in out and '"status":"compacted"' in out
    assert '"agent_name":"risk_manager"' in out and '"risk_score":0.3' in out
    assert '"secrets":{"session_token":"tok-123"}' in out  # open mode holds every scope
    for event in ("thread.created", "agent_state.created", "agent_state.updated"):
        assert f'"type":"{event}"' in out


@pytest.mark.slow
def test_the_event_stream_line_streams_as_pasted(database_url: str, uid: str) -> None:
    """`curl -N .../v1/events/stream`: curl sends `Accept: */*`, which takes the stream (it
    answered 406). The stream never ends; the line runs until its timeout here."""
    line = next(block for block in fenced("sh") if "/v1/events/stream" in block)
    with ServerProcess(database_url) as server:
        made = httpx.put(f"{server.base_url}/v1/threads/streamed-{uid}", json={"state": {}},
                         headers={"If-None-Match": "*"})
        assert made.status_code == 201, made.text
        script = line.replace("localhost:8080", f"127.0.0.1:{server.port}")
        result = subprocess.run(["timeout", "3", "bash", "-c", script], capture_output=True,
                                text=True, timeout=60, check=False)
    assert result.returncode == 124, (result.returncode, result.stderr)  # cut by timeout
    assert result.stdout.startswith("retry: 1000\n"), result.stdout
    assert f'"resource":"/v1/threads/streamed-{uid}"' in result.stdout, result.stdout


@pytest.mark.slow
def test_the_memory_example_runs_as_pasted(database_url: str) -> None:
    out = pasted(next(block for block in fenced("sh") if "U=user-$RANDOM" in block),
                 database_url)
    assert re.findall(r"HTTP/1.1 (\d{3})", out) == ["201"]
    found = json.loads(out.splitlines()[-1])
    assert [item["key"] for item in found["data"]] == ["theme"], found  # "lang": 9 < 9.5
    assert found["data"][0]["score"] > 0 and found["data"][0]["expires_at"], found
