"""Every mapped class, imported so that `Base.metadata` is complete (Alembic, `alembic check`)."""

from app.agent_states.models import AgentState
from app.auth.models import ApiKey
from app.checkpoints.models import Checkpoint, CheckpointBlob, CheckpointItem, CheckpointWrite
from app.compactions.models import Compaction
from app.db.base import Base
from app.events.models import Event
from app.idempotency.models import IdempotencyKey, TenantIdempotencyKey
from app.mcp_servers.models import McpServer
from app.messages.models import Message
from app.store.models import StoreItem, StoreVector
from app.threads.models import Thread, ThreadRevision

__all__ = [
    "AgentState", "ApiKey", "Base", "Checkpoint", "CheckpointBlob", "CheckpointItem",
    "CheckpointWrite", "Compaction", "Event", "IdempotencyKey", "McpServer",
    "Message", "StoreItem", "StoreVector", "TenantIdempotencyKey", "Thread", "ThreadRevision",
]
