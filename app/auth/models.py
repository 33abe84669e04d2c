from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, Name, UTCDateTime


class ApiKey(Base):
    """An API key: its public `key_id`, its tenant and scopes, and a hash of the token.

    The only table read across tenants (a key is what tells us the tenant), so it opts out of
    the tenant guard (`app/db/tenancy.py`).
    """

    __tablename__ = "api_keys"
    __table_args__ = ({"info": {"cross_tenant": True}},)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    tenant_id: Mapped[str] = mapped_column(Name, index=True)
    name: Mapped[str] = mapped_column(Name)
    scopes: Mapped[str] = mapped_column(String(255))
    # sha256 of the whole token, hex: the token is 256 random bits, so a slow hash adds nothing.
    hash: Mapped[str] = mapped_column(String(64), info={"secret": True})
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
