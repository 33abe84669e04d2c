"""Settings, read from `AGENTSTATE_*` environment variables, an optional `.env`, and files.

A file named like the variable (`AGENTSTATE_DATABASE_URL`) in the secrets directory supplies
that setting when the environment does not: that is how `podman secret`s reach the service
(see `secrets_dir()`).

Nothing reads the environment at import time: `Settings()` is built by the CLI (or a test)
and handed to `create_app(settings)`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from app.core.pgurl import check_parameters


def data_dir() -> Path:
    """`$XDG_DATA_HOME/agentstate`, falling back to `~/.local/share/agentstate` (XDG spec)."""
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "agentstate"


def default_database_url() -> str:
    return f"sqlite+aiosqlite:///{data_dir() / 'state.db'}"


def secrets_dir() -> Path | None:
    """`$AGENTSTATE_SECRETS_DIR`, else `/run/secrets` when it exists.

    Podman and Docker mount each secret as a file under /run/secrets. Files rather than
    `type=env` secrets: an environment is inherited by every child process, and podman 5.4
    shows an env secret given a `target=` in clear in `podman inspect`.
    """
    configured = os.environ.get("AGENTSTATE_SECRETS_DIR", "").strip()
    if configured:
        # A mistyped directory must not quietly leave the database URL at its SQLite default.
        if not Path(configured).is_dir():
            raise ValueError(f"AGENTSTATE_SECRETS_DIR={configured} is not a directory")
        return Path(configured)
    default = Path("/run/secrets")
    return default if default.is_dir() else None


def sqlite_file(database: str | None, query: Mapping[str, Any]) -> Path | None:
    """The file of a SQLite URL's database (None: in memory); `file:` URIs (`?uri=true`)
    included."""
    if not database or database == ":memory:" or "mode=memory" in str(query):
        return None
    if query.get("uri") and database.startswith("file:"):
        database = database.removeprefix("file:").split("?", 1)[0]
    return Path(database).expanduser()


def normalise_database_url(url: str) -> str:
    """Pick the async driver for the URLs people actually paste."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    if url.startswith("sqlite://"):
        return "sqlite+aiosqlite://" + url[len("sqlite://") :]
    return url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        # An empty variable (`AGENTSTATE_DATABASE_URL=`) means the default, as in a shell.
        env_prefix="AGENTSTATE_", env_file=".env", extra="ignore", frozen=True,
        env_ignore_empty=True,
    )

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL; postgresql://... is normalised to asyncpg.",
    )
    # Behind a transaction-pooling PgBouncer (docs/SCALING.md): no startup parameters, the
    # timeouts set per transaction, no prepared statement outlives its transaction, reads in
    # transactions too, and no LISTEN through it (the direct URL's, else polling).
    database_pooler: Literal["none", "transaction"] = Field(
        "none", description="`transaction`: AGENTSTATE_DATABASE_URL reaches Postgres through a "
                            "transaction pooler (PgBouncer pool_mode=transaction).")
    direct_database_url: str | None = Field(
        None, description="Postgres itself, not the pooler: the change feed LISTENs on it and "
                          "`agentstate migrate` runs on it.")
    # Postgres pool (ignored on SQLite).
    # Above the steady concurrency: a connection returned to a full pool is closed, so a pool
    # smaller than the requests in flight opens (and Postgres forks) a connection per request.
    pool_size: int = Field(20, ge=1)
    max_overflow: int = Field(10, ge=0)
    pool_recycle: int = Field(1800, ge=-1, description="Seconds before a connection is replaced.")
    pool_timeout: float = Field(5.0, gt=0, description="Seconds to wait for a free connection.")
    pool_pre_ping: bool = True
    pool_ping_idle_seconds: float = Field(
        1.0, ge=0, description="Ping only connections idle this long; 0 pings every checkout."
    )
    connect_timeout: float = Field(5.0, gt=0)
    statement_timeout_ms: int = Field(30_000, ge=0, description="Postgres statement_timeout.")
    database_timeout: float = Field(
        10.0, gt=0,
        description="Seconds a request waits on a database that stopped answering (a network "
                    "partition) before it is answered 503; also bounds the connection ping.")
    idle_in_transaction_timeout_ms: int = Field(
        60_000, ge=0,
        description="Postgres idle_in_transaction_session_timeout: a stalled client cannot "
                    "hold row locks longer.")
    sqlite_busy_timeout_ms: int = Field(30_000, ge=0)
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL", "EXTRA"] = "FULL"

    # On the embedded SQLite default `serve` migrates by itself; on Postgres it never does.
    auto_migrate: bool | None = Field(
        None, description="Run migrations at start-up. Default: on for SQLite, off for Postgres."
    )
    require_preconditions: bool = Field(
        True, description="Writes to existing resources need If-Match (428 otherwise)."
    )

    # Limits (section 1 of the API contract).
    max_body_bytes: int = Field(1_048_576, ge=1024)
    max_json_depth: int = Field(64, ge=2)
    # Checkpoint writes carry a graph's channel values (base64 in JSON), which outgrow the
    # general limit; this one applies to /v1/threads/{id}/checkpoints and below only.
    max_checkpoint_body_bytes: int = Field(64 * 1_048_576, ge=1024)
    max_batch_messages: int = Field(100, ge=1)
    max_metadata_keys: int = Field(64, ge=1)
    idempotency_ttl_hours: int = Field(24, ge=24)
    thread_history: int = Field(
        100, ge=0, le=100_000,
        description="Revisions of a thread's state history kept (a thread's `history_limit` "
                    "overrides it); 0 keeps none.")

    # The store (API.md section 7b): limits checked before anything is written.
    store_max_value_bytes: int = Field(
        262_144, ge=1024, description="Largest store item value, as compact JSON (UTF-8).")
    store_max_namespace_labels: int = Field(10, ge=1, le=10)
    store_max_label_chars: int = Field(
        255, ge=1, le=255, description="Longest namespace label as a URL segment (encoded).")
    store_max_vector_dims: int = Field(4096, ge=1, le=16_000)
    store_max_item_vectors: int = Field(
        64, ge=1, le=1000, description="Vectors one store item holds at most (all indexes).")
    store_hnsw_min_vectors: int = Field(
        20_000, ge=1, description="Where Postgres has pgvector: a vector index (per tenant) "
                                  "of this many vectors is searched by HNSW, a smaller one "
                                  "exactly in SQL (app/store/pgvector.py).")
    store_hnsw_ef_search: int = Field(
        200, ge=1, le=1000, description="Where a search uses HNSW: the candidates its scan "
                                        "keeps (pgvector's `hnsw.ef_search`; at least the "
                                        "page asked for). Higher: better recall, slower.")
    store_hnsw_m: int = Field(
        16, ge=2, le=100, description="Where Postgres has pgvector: the links per vector of an "
                                      "HNSW index built from now on (pgvector's `m`; "
                                      "`agentstate reindex` rebuilds those built otherwise).")
    store_hnsw_ef_construction: int = Field(
        64, ge=4, le=1000, description="The candidates an HNSW build keeps per vector "
                                       "(pgvector's `ef_construction`, at least twice "
                                       "AGENTSTATE_STORE_HNSW_M). Higher: better recall, "
                                       "slower builds.")

    # The change feed (docs/events.md).
    events_max_wait_seconds: float = Field(
        60.0, gt=0, le=3600, description="Longest `GET /v1/events?wait=` a server grants.")
    events_heartbeat_seconds: float = Field(
        15.0, gt=0, description="An SSE stream sends a comment this often when idle.")
    events_poll_seconds: float = Field(
        0.5, gt=0, description="Without a LISTEN connection (a transaction pooler and no "
                               "AGENTSTATE_DIRECT_DATABASE_URL), how often a server reads the "
                               "newest seq of the tenants it has watchers of.")
    events_tick_seconds: float = Field(
        1.0, gt=0, description="How often a server with watchers of a tenant checks that "
                               "tenant's feed without being woken (a writer that died between "
                               "its commit and its wake-up, another SQLite process).")

    # Retention (docs/events.md); None keeps forever.
    event_retention_hours: float | None = Field(
        None, gt=0, description="Events older than this are removed by the sweeper.")
    tombstone_retention_hours: float | None = Field(
        None, gt=0, description="Deleted threads' tombstones older than this are removed.")
    sweep_interval_seconds: float = Field(
        60.0, gt=0, description="How often the background sweeper runs; see `agentstate gc`.")
    sweep_batch: int = Field(500, ge=1, le=100_000,
                             description="Rows one sweeper transaction removes at most.")
    sweep_enabled: bool = Field(True, description="Run the retention sweeper in `serve`.")

    # Access control (API.md section 9, docs/auth.md).
    auth_cache_seconds: float = Field(
        5.0, ge=0, le=300,
        description="How long a server trusts what it read about API keys: a revoked key is "
                    "refused, and the first key created ends open mode, within this time.",
    )
    require_api_keys: bool = Field(
        False, description="Never run open, even with no keys (serve sets it off loopback).",
    )

    # MCP secrets: comma-separated keys, the first encrypts, any decrypts.
    secret_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)

    # HTTP (API.md section 1): the absolute base of `Link` URLs (a relative reference when
    # unset), and the bytes a page of a list may hold before it ends early with a cursor.
    public_base_url: str | None = Field(
        None, description="e.g. https://state.example.com; `Link` is relative when unset.")
    max_page_bytes: int = Field(4 * 1024 * 1024, ge=1024)

    # Host names an open (no keys) server answers besides the loopback names, so a web page
    # cannot reach it through a DNS-rebinding domain (app/http/posture.py). `*` allows any.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    max_header_bytes: int = Field(
        16_384, ge=1024, description="Largest request head (line and headers); larger: 431.")
    max_requests_in_flight: int = Field(
        1000, ge=1, description="Requests one worker serves at once (streams and long polls "
                                "included); one more: 503 `overloaded`.")

    console_enabled: bool = Field(
        True, description="Serve the read-only audit console at /console (docs/console.md).")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    retry_after_seconds: int = Field(2, ge=1, description="Retry-After sent with 503.")
    drain_seconds: float = Field(
        0.0, ge=0, le=300,
        description="On SIGTERM, answer /readyz 503 for this long while still serving, so a "
                    "load balancer takes the server out of rotation, before shutting down.")

    # Traces (docs/operations.md): OpenTelemetry's own variables, named as the SDK names them.
    # On when OTEL_TRACES_EXPORTER names an exporter (console, otlp, ...) and OTEL_SDK_DISABLED
    # is not true; the SDK reads the other OTEL_* variables itself.
    otel_sdk_disabled: str | None = Field(
        None, validation_alias="otel_sdk_disabled",
        description="OTEL_SDK_DISABLED: `true` turns tracing off whatever the exporter.")
    otel_traces_exporter: str | None = Field(
        None, validation_alias="otel_traces_exporter",
        description="OTEL_TRACES_EXPORTER: where spans go; unset or `none`: no tracing.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Resolved per instance, not at import time; an explicit `_secrets_dir=` still wins.
        source = file_secret_settings
        if isinstance(source, SecretsSettingsSource) and source.secrets_dir is None:
            source.secrets_dir = secrets_dir()
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("direct_database_url")
    @classmethod
    def _normalise_direct_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        url = cls._normalise_url(value)
        if not url.startswith("postgresql"):
            raise ValueError("must be a postgresql://... URL (Postgres itself, not the pooler)")
        return url

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        url = normalise_database_url(value.strip()) if value.strip() else default_database_url()
        try:
            backend = make_url(url).get_backend_name()
        except ArgumentError:
            # Never echo the value: it may hold a password.
            raise ValueError("is not a database URL; expected postgresql://user:password@"
                             "host:5432/database or sqlite:///path/to/file.db") from None
        if backend not in ("postgresql", "sqlite"):
            raise ValueError(f"names the {backend} database, which agentstate does not "
                             "support; use postgresql://... or sqlite:///...")
        if backend == "postgresql":
            check_parameters(make_url(url).query)  # libpq's names; unknown ones refused
        return url

    @field_validator("store_hnsw_ef_construction")
    @classmethod
    def _twice_m(cls, value: int, info: ValidationInfo) -> int:
        m = info.data.get("store_hnsw_m")
        if m is not None and value < 2 * m:  # pgvector refuses the index otherwise
            raise ValueError(f"must be at least twice AGENTSTATE_STORE_HNSW_M ({2 * m})")
        return value

    @field_validator("otel_traces_exporter")
    @classmethod
    def _known_exporters(cls, value: str | None, info: ValidationInfo) -> str | None:
        disabled = (info.data.get("otel_sdk_disabled") or "").strip().lower() == "true"
        if value is not None and not disabled:
            from app.core.tracing import exporter_names

            exporter_names(value)  # installed, or one line saying what to install
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().lower() for part in value.split(",") if part.strip()]
        return value

    @field_validator("secret_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def pooled(self) -> bool:
        """Postgres through a transaction pooler."""
        return self.database_pooler == "transaction" and not self.is_sqlite

    @property
    def should_auto_migrate(self) -> bool:
        return self.is_sqlite if self.auto_migrate is None else self.auto_migrate

    @property
    def tracing(self) -> bool:
        """Whether requests are traced (OpenTelemetry's switches, as the SDK reads them)."""
        exporters = (self.otel_traces_exporter or "").strip().lower()
        disabled = (self.otel_sdk_disabled or "").strip().lower() == "true"
        return exporters not in ("", "none") and not disabled

    @property
    def debug(self) -> bool:
        return self.log_level == "DEBUG"

    def redacted_database_url(self) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.database_url).render_as_string(hide_password=True)


def describe_settings_error(error: ValidationError) -> str:
    """A settings error as the operator wrote it: by environment variable, one per line,
    never echoing the value (it may be a password or a key)."""
    lines = []
    for item in error.errors():
        field = str(item["loc"][0]) if item.get("loc") else "?"
        # OpenTelemetry's own variables keep their names (no AGENTSTATE_ prefix).
        name = field.upper() if field.startswith("otel_") else f"AGENTSTATE_{field.upper()}"
        ctx = item.get("ctx") or {}
        kind = item.get("type", "")
        bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
                  "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
        if kind in bounds:
            sign, key = bounds[kind]
            lines.append(f"{name} must be {sign} {ctx.get(key)}")
        elif kind in ("int_parsing", "int_from_float"):
            lines.append(f"{name} must be a whole number")
        elif kind == "float_parsing":
            lines.append(f"{name} must be a number")
        elif kind == "bool_parsing":
            lines.append(f"{name} must be true or false")
        elif kind == "literal_error":
            lines.append(f"{name} must be one of {ctx.get('expected')}")
        elif kind == "value_error":
            lines.append(f"{name} {ctx.get('error') or item['msg']}")
        else:
            lines.append(f"{name}: {item['msg']}")
    return "\n".join(lines)
