"""Every mapped class, imported so that `Base.metadata` is complete (Alembic, `alembic check`)."""

from app.agent_states.models import AgentState
from app.db.base import Base
from app.compactions.models import Compaction
from app.events.models import Event
from app.mcp_servers.models import McpServer
from app.messages.models import IdempotencyKey, Message
from app.threads.models import Thread

__all__ = ["AgentState", "Base", "Compaction", "Event", "IdempotencyKey", "McpServer", "Message",
           "Thread"]
