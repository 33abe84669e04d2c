"""Every mapped class, imported so that `Base.metadata` is complete (Alembic, `alembic check`)."""

from app.db.base import Base
from app.compactions.models import Compaction
from app.events.models import Event
from app.messages.models import IdempotencyKey, Message
from app.threads.models import Thread

__all__ = ["Base", "Compaction", "Event", "IdempotencyKey", "Message", "Thread"]
