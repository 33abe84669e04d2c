"""Every mapped class, imported so that `Base.metadata` is complete (Alembic, `alembic check`)."""

from app.auth.models import ApiKey
from app.db.base import Base
from app.events.models import Event
from app.threads.models import Thread

__all__ = ["ApiKey", "Base", "Event", "Thread"]
