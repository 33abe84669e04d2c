"""The client as a package: its public surface, its independence from the server code, and a
fresh virtualenv with only `client/` installed talking to a real server."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import agentstate_client
import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient, errors

from tests.support import ROOT, ServerProcess

CLIENT = ROOT / "client"


def test_public_exports_are_pinned() -> None:
    assert sorted(agentstate_client.__all__) == sorted([
        "APIConnectionError", "APIError", "APITimeoutError", "AgentState", "AgentStateClient",
        "AgentStateError", "AlreadyExists", "AppendResult", "AsyncAgentStateClient",
        "Compaction", "Conflict", "Event", "McpServer", "Message", "NotFound", "Page",
        "PreconditionFailed", "PreconditionRequired", "RevisionMismatch", "Thread",
        "ThreadDeleted", "Unauthorized", "__version__",
    ])
    for name in agentstate_client.__all__:
        assert getattr(agentstate_client, name) is not None
    error_classes = {name for name, value in vars(errors).items()
                     if isinstance(value, type) and issubclass(value, Exception)}
    assert error_classes == set(errors.__all__) - {"error_from_response"}


def test_sync_and_async_clients_offer_the_same_documented_methods() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    methods = public(AgentStateClient) - {"close"}
    assert methods == public(AsyncAgentStateClient) - {"aclose"}
    client, aclient = AgentStateClient(), AsyncAgentStateClient()
    for name in methods - {"base_url"}:
        sync_method, async_method = getattr(client, name), getattr(aclient, name)
        assert inspect.getdoc(sync_method), f"{name} has a docstring"
        assert inspect.signature(sync_method) == inspect.signature(async_method)
        assert "self" not in inspect.signature(sync_method).parameters
    assert inspect.iscoroutinefunction(aclient.get_thread)
    assert inspect.signature(client.get_thread).return_annotation == "Thread"
    client.close()


@pytest.mark.slow
def test_client_never_imports_the_server() -> None:
    for path in CLIENT.rglob("*.py"):
        source = path.read_text()
        assert "from app" not in source and "import app" not in source, path
    probe = ("import json, sys, agentstate_client, agentstate_client.aisuite, "
             "agentstate_client.colosseum; print(json.dumps(sorted(m for m in sys.modules "
             "if m == 'app' or m.startswith(('app.', 'fastapi', 'sqlalchemy', 'pydantic')))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd="/")
    # aisuite is installed here and brings pydantic; the client itself brings nothing.
    assert not [m for m in json.loads(out.stdout) if not m.startswith("pydantic")]


SCRIPT = textwrap.dedent("""
    import sys
    from agentstate_client import AgentStateClient, RevisionMismatch
    from agentstate_client.colosseum import save_conversation, load_conversation_history

    with AgentStateClient(sys.argv[1]) as client:
        thread = client.create_thread(state={"step": 0})
        client.append_message(thread.thread_id, "user", "hello")
        updated = client.update_thread(thread.thread_id, lambda s: {"step": s["step"] + 1})
        try:
            client.put_thread(thread.thread_id, {}, if_match=1)
        except RevisionMismatch as exc:
            conflict = exc.current_revision
    save_conversation(thread.thread_id, "bot", "assistant", "hi")
    history = load_conversation_history(thread.thread_id)
    print(updated.revision, updated.state["step"], conflict,
          [m["content"] for m in history])
    try:
        import app
    except ImportError:
        print("no server code")
""")


@pytest.mark.slow
def test_fresh_venv_with_only_the_client(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(CLIENT)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout
    installed = {line.split("==")[0].lower() for line in listed.split()}
    assert "agentstate-client" in installed and "httpx" in installed
    assert not installed & {"fastapi", "sqlalchemy", "pydantic", "aisuite", "agentstate"}

    database = f"sqlite+aiosqlite:///{tmp_path / 'state.db'}"
    with ServerProcess(database, env={"AGENTSTATE_AUTO_MIGRATE": "true"}) as server:
        script = tmp_path / "agent.py"
        script.write_text(SCRIPT)
        run = subprocess.run([str(python), str(script), server.base_url], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path,
                             env={"AGENTSTATE_URL": server.base_url, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["3 1 3 ['hello', 'hi']", "no server code"]
