from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.core.schemas import AwareTimestamp, JsonObject, Name, Strict, Timestamp

MASK = "***"
SECRETS_RULE = (f'Omitted: the stored secrets are kept. `{{}}` or null: cleared. A value of '
                f'`"{MASK}"`: that stored secret is kept unchanged.')


class McpServerReplace(Strict):
    server_type: Name
    state: JsonObject = Field(default_factory=dict)
    secrets: dict[Name, str] | None = Field(None, description=SECRETS_RULE)
    last_connected_at: AwareTimestamp | None = Field(
        None, description="RFC 3339 with a time zone. Omitted: the stored value is kept."
    )


class McpServerPatch(Strict):
    """RFC 7396 merge-patch of the representation. In `secrets`, a member set to null removes
    that secret; `{}` clears them all, as on PUT (the contract's rule for every write)."""

    server_type: Name | None = None
    state: JsonObject | None = None
    secrets: dict[Name, str | None] | None = None
    last_connected_at: AwareTimestamp | None = None


class McpServerOut(BaseModel):
    server_name: str
    server_type: str
    revision: int
    state: JsonObject
    secrets: dict[str, str] = Field(
        description=f'Names mapped to `"{MASK}"`; the values only with `?include_secrets=true`.'
    )
    last_connected_at: Timestamp | None
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def from_row(cls, row: Any, secrets: dict[str, str]) -> McpServerOut:
        """`secrets` are what this reader may see: masked, or opened for `secrets:read`."""
        return cls(
            server_name=row.server_name, server_type=row.server_type, revision=row.revision,
            state=row.state, secrets=secrets, last_connected_at=row.last_connected_at,
            created_at=row.created_at, updated_at=row.updated_at,
        )
