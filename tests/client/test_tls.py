"""Both clients verify an `https://` server's certificate against httpx's default roots, or
the ones `SSL_CERT_FILE` names when it is set (the TLS context is made once per process and
setting, not once per client): checked against a small HTTPS server with a certificate of
its own making."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from agentstate_client import AgentStateClient, APIConnectionError, AsyncAgentStateClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

THREAD = {"thread_id": "t1", "revision": 3, "state": {}, "metadata": {},
          "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:01Z",
          "message_count": 0}


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentstate test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(THREAD).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, certificate file) of a server that answers every GET with THREAD."""
    cert, key = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


def read_blocking(base_url: str) -> str:
    with AgentStateClient(base_url, max_retries=0) as client:
        return client.get_thread("t1").thread_id


def read_async(base_url: str) -> str:
    async def read() -> str:
        async with AsyncAgentStateClient(base_url, max_retries=0) as client:
            return (await client.get_thread("t1")).thread_id

    return asyncio.run(read())


@pytest.mark.parametrize("read", [read_blocking, read_async])
def test_an_unknown_certificate_is_refused_unless_ssl_cert_file_names_it(
        https_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch,
        read: Callable[[str], str]) -> None:
    base_url, cert = https_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with pytest.raises(APIConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        read(base_url)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert read(base_url) == "t1"
    assert read(base_url) == "t1"
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(APIConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        read(base_url)
