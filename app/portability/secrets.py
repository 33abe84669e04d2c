"""MCP server secrets in an export: the stored ciphertext with the id of the key that opens
it (the default: restorable where the same keys are configured), re-sealed under a
passphrase (`--secrets-passphrase-file`: restorable anywhere with the passphrase), or left
out (`--redact-secrets`).

In every mode the secret values never appear in clear in the file. A passphrase export seals
the owner (tenant, server name) with the values, as the database does, so a sealed value
copied to another record does not open there.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidKey
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from app.core.errors import SecretsUndecryptable
from app.core.jsonutil import dumps
from app.core.secretbox import SecretBox
from app.portability.format import SecretsMode

# scrypt's interactive-login cost from its paper's successors (RFC 7914 section 2): about
# 0.1 s and 32 MiB once per export or import, nothing per secret.
SCRYPT = {"name": "scrypt", "n": 2**15, "r": 8, "p": 1}


class SecretsError(Exception):
    """Secrets cannot be written or read as asked; the message says why (never a value)."""


def read_passphrase(path: str) -> bytes:
    text = Path(path).read_bytes().rstrip(b"\r\n")
    if not text:
        raise SecretsError(f"{path} is empty; a passphrase file holds the passphrase.")
    return text


def _fernet(passphrase: bytes, kdf: dict[str, Any]) -> Fernet:
    try:
        if kdf.get("name") != "scrypt":
            raise SecretsError(f"unknown key derivation {kdf.get('name')!r}")
        salt = base64.b64decode(kdf["salt"])
        key = Scrypt(salt=salt, length=32, n=int(kdf["n"]), r=int(kdf["r"]),
                     p=int(kdf["p"])).derive(passphrase)
    except (KeyError, ValueError, TypeError, InvalidKey) as exc:
        raise SecretsError(f"the header's kdf is not usable: {exc}") from None
    return Fernet(base64.urlsafe_b64encode(key))


def new_kdf() -> dict[str, Any]:
    return {**SCRYPT, "salt": base64.b64encode(os.urandom(16)).decode()}


class SecretsOut:
    """Writes the `secrets` field of mcp_server records."""

    def __init__(self, mode: SecretsMode, box: SecretBox | None,
                 passphrase: bytes | None = None, kdf: dict[str, Any] | None = None) -> None:
        self.mode = mode
        self.box = box
        self.sealer = _fernet(passphrase, kdf) if passphrase and kdf else None
        if mode == "passphrase" and (self.sealer is None or box is None):
            raise SecretsError("re-sealing secrets under a passphrase needs the keys that "
                               "open them: set AGENTSTATE_SECRET_KEYS as the server has it.")

    def field(self, tenant_id: str, server_name: str, token: str | None) -> Any:
        if token is None:
            return None
        if self.mode == "redacted":
            return {"redacted": True}
        if self.mode == "ciphertext":
            return {"ciphertext": token,
                    "key_id": self.box.key_id_of(token) if self.box is not None else None}
        assert self.box is not None and self.sealer is not None
        owner = [tenant_id, server_name]
        try:
            values = self.box.open(owner, token)
        except SecretsUndecryptable as exc:
            raise SecretsError(f"MCP server {tenant_id}/{server_name}: {exc.detail}") from None
        sealed = self.sealer.encrypt(dumps({"owner": owner, "secrets": values}).encode())
        return {"passphrase": sealed.decode()}


class SecretsIn:
    """Turns the `secrets` field of an imported record into the stored columns."""

    def __init__(self, mode: SecretsMode, box: SecretBox | None,
                 passphrase: bytes | None = None, kdf: dict[str, Any] | None = None) -> None:
        self.mode = mode
        self.box = box
        self.opener: Fernet | None = None
        if mode == "passphrase":
            if passphrase is None:
                raise SecretsError("this export's secrets are sealed under a passphrase: "
                                   "pass --secrets-passphrase-file.")
            self.opener = _fernet(passphrase, kdf or {})

    def check(self, value: Any, names: list[str]) -> None:
        """Raise ValueError if the field does not have the shape the header's mode says."""
        if value is None:
            if names:
                raise ValueError("secret_names are listed but secrets is null")
            return
        if not isinstance(value, dict) or not names:
            raise ValueError("secrets must be null or an object, with secret_names listed")
        expected = {"ciphertext": {"ciphertext", "key_id"}, "passphrase": {"passphrase"},
                    "redacted": {"redacted"}}[self.mode]
        if set(value) != expected:
            raise ValueError(f"a {self.mode} export's secrets have the members "
                             f"{sorted(expected)}")
        if self.mode == "ciphertext" and not isinstance(value["ciphertext"], str):
            raise ValueError("secrets.ciphertext must be a string")
        if self.mode == "passphrase" and not isinstance(value["passphrase"], str):
            raise ValueError("secrets.passphrase must be a string")

    def values(self, tenant_id: str, server_name: str, value: Any) -> dict[str, str] | None:
        """The clear values of a passphrase-sealed field (None in the other modes)."""
        if value is None or self.opener is None:
            return None
        try:
            sealed = json.loads(self.opener.decrypt(value["passphrase"].encode()))
        except InvalidToken:
            raise SecretsError("the passphrase does not open the secrets of MCP server "
                               f"{tenant_id}/{server_name}") from None
        if sealed.get("owner") != [tenant_id, server_name]:
            raise SecretsError(f"the secrets in the record of MCP server "
                               f"{tenant_id}/{server_name} belong to another server")
        return dict(sealed["secrets"])

    def columns(self, tenant_id: str, server_name: str, value: Any,
                names: list[str]) -> tuple[str | None, list[str]]:
        """(secrets column, secret_names) to store."""
        if value is None or self.mode == "redacted":
            return None, []  # a redacted export restores servers without their secrets
        if self.mode == "ciphertext":
            return value["ciphertext"], names
        if self.box is None:
            raise SecretsError("this server has no key to encrypt secrets with; set "
                               "AGENTSTATE_SECRET_KEYS (see `agentstate secrets new-key`).")
        clear = self.values(tenant_id, server_name, value)
        assert clear is not None
        return self.box.seal([tenant_id, server_name], clear), list(clear)

    def same(self, tenant_id: str, server_name: str, value: Any, stored: str | None) -> bool:
        """Whether the stored ciphertext holds what the record's field holds."""
        if value is None or self.mode == "redacted":
            return stored is None
        if stored is None:
            return False
        if self.mode == "ciphertext" and value["ciphertext"] == stored:
            return True
        if self.box is None:
            return False
        owner = [tenant_id, server_name]
        try:
            held = self.box.open(owner, stored)
            incoming = (self.values(tenant_id, server_name, value) if self.mode == "passphrase"
                        else self.box.open(owner, value["ciphertext"]))
        except SecretsUndecryptable:
            return False
        return held == incoming

    def openable(self, tenant_id: str, server_name: str, token: str | None) -> bool:
        """Whether this server's keys open a stored ciphertext (True when there is none)."""
        if token is None:
            return True
        if self.box is None:
            return False
        try:
            self.box.open([tenant_id, server_name], token)
        except SecretsUndecryptable:
            return False
        return True
