"""Authenticated encryption of secrets at rest (MCP server secrets).

Fernet (AES-128-CBC with HMAC-SHA256, from `cryptography`) through `MultiFernet`: it is
authenticated, a key is one standard url-safe base64 string, and rotation is built in
(encrypt with the first key, decrypt with any, `rotate()` re-encrypts with the first), so we
need no key-id format of our own. Fernet has no associated data, so the owner of a
ciphertext (tenant and server name) is sealed inside the authenticated plaintext and checked
on opening: a ciphertext copied to another row or tenant does not open there.

Keys come from AGENTSTATE_SECRET_KEYS. On SQLite with no key configured, one is generated
once into `secret.key` beside the database file (mode 0600): the key travels with the file it
protects, wherever AGENTSTATE_DATABASE_URL puts it. On Postgres without a key, writes that
carry secrets are refused with 503 `secrets_not_configured`. No message
here ever contains key material or a secret.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from app.core.errors import SecretsNotConfigured, SecretsUndecryptable
from app.core.jsonutil import dumps
from app.core.settings import Settings, sqlite_file

KEY_FILE = "secret.key"
# Secrets moved from the embedded default (agentstate copy) are sealed with the key file
# beside the SQLite database they were written to: the fix every message below names.
FROM_SQLITE = "moved from SQLite: the key in the secret.key file beside that database"
log = logging.getLogger("agentstate.secrets")


class SecretKeyError(RuntimeError):
    """A configured key is unusable (the message names the key's position, never its value)."""


class SecretBox:
    def __init__(self, keys: Sequence[str | bytes]) -> None:
        fernets = []
        for position, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError):
                raise SecretKeyError(
                    f"AGENTSTATE_SECRET_KEYS: key {position} of {len(keys)} is not a Fernet key "
                    "(32 bytes, url-safe base64); make one with `agentstate secrets new-key`."
                ) from None
        self._fernet = MultiFernet(fernets)
        self._keyed = [(key_id(key), fernet) for key, fernet in zip(keys, fernets, strict=True)]

    def seal(self, owner: list[str], values: dict[str, str]) -> str:
        return self._fernet.encrypt(dumps({"owner": owner, "secrets": values}).encode()).decode()

    def open(self, owner: list[str], token: str) -> dict[str, str]:
        try:
            sealed = json.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            raise SecretsUndecryptable(
                "The stored secrets were encrypted with a key that is not in "
                "AGENTSTATE_SECRET_KEYS; add that key (after the current one) to read them "
                f"({FROM_SQLITE})."
            ) from None
        if sealed.get("owner") != owner:
            raise SecretsUndecryptable("The stored secrets belong to another resource.")
        return dict(sealed["secrets"])

    def key_id_of(self, token: str) -> str | None:
        """The id of the configured key that opens `token` (None: none does). Fernet tokens
        do not name their key, so each key is tried."""
        for identifier, fernet in self._keyed:
            try:
                fernet.decrypt(token.encode())
            except InvalidToken:
                continue
            return identifier
        return None

    def rotate(self, token: str) -> str:
        """The same plaintext, encrypted with the first key (InvalidToken if no key opens it)."""
        return self._fernet.rotate(token.encode()).decode()


def key_id(key: str | bytes) -> str:
    """A key's public name: 16 hex digits of its sha256, which tell keys apart in exports and
    messages and reveal nothing of the key."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw.strip()).hexdigest()[:16]


def new_key() -> str:
    return Fernet.generate_key().decode()


def _key_file(path: Path) -> str:
    """The key in `path`, created first if missing: written to a private temporary file and
    linked into place, so it appears complete with mode 0600 or not at all, and two processes
    starting together end up with the same key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (new_key() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            log.warning("generated the key for MCP secrets at %s; back it up with the "
                        "database, or the secrets cannot be read", path)
        except FileExistsError:
            pass  # another process made it first; use theirs
        finally:
            os.unlink(tmp)
    return path.read_text().strip()


def key_file_path(settings: Settings) -> Path | None:
    """Where the generated key of a SQLite database lives (None: Postgres, or in memory)."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.database_url)
    database = sqlite_file(url.database, url.query) if url.get_backend_name() == "sqlite" else None
    return database.absolute().parent / KEY_FILE if database is not None else None


def secrets_status(settings: Settings) -> str:
    """For the start banner: where the key for MCP secrets comes from."""
    if settings.secret_keys:
        return f"configured ({len(settings.secret_keys)} key(s) in AGENTSTATE_SECRET_KEYS)"
    path = key_file_path(settings)
    return f"key file {path}" if path else "not configured"


def load_secret_box(settings: Settings, *, create: bool = True) -> SecretBox | None:
    """The box for these settings, or None when no key is configured (see module docstring).
    `create=False` reads a SQLite database's key file only if it exists (a copy's source)."""
    keys = [key.get_secret_value() for key in settings.secret_keys]
    if keys:
        return SecretBox(keys)
    path = key_file_path(settings)
    if path is not None and (create or path.exists()):
        try:
            return SecretBox([_key_file(path)])
        except SecretKeyError:
            raise SecretKeyError(f"{path} does not hold a valid key; restore it from a "
                                 "backup or set AGENTSTATE_SECRET_KEYS.") from None
    return None


def keys_source(settings: Settings) -> str:
    """Where the keys of these settings come from, as an operator names them."""
    if settings.secret_keys:
        return "AGENTSTATE_SECRET_KEYS"
    path = key_file_path(settings)
    return f"the key in {path}" if path is not None else "AGENTSTATE_SECRET_KEYS (not set)"


def require_box(box: SecretBox | None) -> SecretBox:
    """The box to seal new secrets with."""
    if box is None:
        raise SecretsNotConfigured(
            "This server has no key to encrypt secrets with; set AGENTSTATE_SECRET_KEYS to "
            f"the key that sealed the secrets already stored ({FROM_SQLITE}), or, if there "
            "are none, to a new key from `agentstate secrets new-key`."
        )
    return box


def require_opener(box: SecretBox | None) -> SecretBox:
    """The box to open stored secrets with: only the key that sealed them can."""
    if box is None:
        raise SecretsNotConfigured(
            "This server has no key to open the stored secrets with; set "
            f"AGENTSTATE_SECRET_KEYS to the key that sealed them ({FROM_SQLITE}, e.g. "
            "AGENTSTATE_SECRET_KEYS=$(cat /path/to/secret.key)). A new key cannot open them."
        )
    return box
