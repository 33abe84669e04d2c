"""`agentstate`: the command line, assembled from the commands of each part of the app.

Each package registers its own subcommands (`register(sub)` in its `commands.py`), as the
retention sweep does: `ops` serve and migrate, `portability` export, import, copy and backup,
`retention` gc, `store` reindex, `mcp_servers` secrets, `auth` keys. What is left here is the
top of the parser and how an error ends a command: one line on stderr and an exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.ops.startup import StartupError


def build_parser() -> argparse.ArgumentParser:
    from app import __version__
    from app.auth.commands import register as register_keys
    from app.mcp_servers.commands import register as register_secrets
    from app.ops.commands import register as register_server
    from app.portability.commands import register as register_portability
    from app.retention.commands import register as register_retention
    from app.store.commands import register as register_store

    parser = argparse.ArgumentParser(
        prog="agentstate", description="The state service AI agents keep their memory in."
    )
    parser.add_argument("--version", action="version", version=f"agentstate {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also AGENTSTATE_LOG_LEVEL=DEBUG)")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in (register_server, register_portability, register_retention,
                     register_store, register_secrets, register_keys):
        register(sub)  # serve, migrate; export, import, copy, backup; gc; reindex; secrets; keys
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; an error is one line on stderr and a non-zero status, the traceback
    only with --debug or AGENTSTATE_LOG_LEVEL=DEBUG."""
    from pydantic import ValidationError

    from app.core.settings import describe_settings_error
    from app.ops.startup import EXIT_MISCONFIGURED, StartupError

    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("AGENTSTATE_LOG_LEVEL", "").strip().upper() == "DEBUG"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except StartupError as error:
        if debug:
            raise
        print(f"agentstate: {error}", file=sys.stderr)
        return error.exit_code
    except ValidationError as error:
        if debug or error.title != "Settings":
            raise
        for line in describe_settings_error(error).splitlines():
            print(f"agentstate: {line}", file=sys.stderr)
        return EXIT_MISCONFIGURED
    except Exception as error:
        if debug:
            raise
        described = _describe(error)
        print(f"agentstate: {described}", file=sys.stderr)
        return described.exit_code


def _describe(error: Exception) -> StartupError:
    """One line for an unexpected error: the database's cause when it is one."""
    from app.ops.startup import EXIT_FAILED, StartupError, database_error

    try:
        settings: Settings | None = Settings()
    except ValueError:  # pydantic's ValidationError
        settings = None
    found = database_error(error, settings) if settings is not None else None
    if found is not None:
        return found
    text = str(error).splitlines()[0] if str(error) else ""
    return StartupError(f"{type(error).__name__}: {text} (run with --debug for the traceback)"
                        if text else f"{type(error).__name__} (run with --debug for the "
                        "traceback)", EXIT_FAILED)


if __name__ == "__main__":
    raise SystemExit(main())
