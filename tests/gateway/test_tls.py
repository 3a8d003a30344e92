"""HTTPS (``gateway.tls``): the gateway and ``ignis serve`` with vLLM's ``--ssl-*`` flags.

Certificates are made here (a test CA, a server certificate for 127.0.0.1, a
client certificate). The gateway answers over TLS and not in plain HTTP;
with ``--ssl-cert-reqs 2`` a client without a certificate the CA signed is
turned away in the handshake; flags that do not go together, or files that do
not load, stop it at start naming the flag; ``ignis serve`` passes the flags
on, waits for its HTTPS gateway and says ``https://``.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import urllib.error
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.gateway.conftest import start_serve, stop_serve
from tests.gateway.hardening_support import gateway_refusal
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer_name: str, issuer_key, ca: bool = False, ip: str | None = None):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip is not None:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path, cert, key=None) -> str:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        path.with_suffix(".key").chmod(0o600)
    return str(path.with_suffix(".crt"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("ignis test CA", ca_key, "ignis test CA", ca_key, ca=True)
    server_key, client_key = _key(), _key()
    return {
        "dir": d,
        "ca": _write(d / "ca", ca),
        "server": _write(d / "server", _cert("127.0.0.1", server_key, "ignis test CA", ca_key, ip="127.0.0.1"),
                         server_key),
        "client": _write(d / "client", _cert("client", client_key, "ignis test CA", ca_key), client_key),
    }


def _flags(pki, *more: str) -> list[str]:
    return ["--ssl-certfile", pki["server"], "--ssl-keyfile", pki["server"][:-4] + ".key", *more]


def _get(url: str, ctx: ssl.SSLContext | None):
    with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
        return r.status, json.loads(r.read())


def _client(pki, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki["ca"])
    if with_cert:
        ctx.load_cert_chain(pki["client"], pki["client"][:-4] + ".key")
    return ctx


def test_the_gateway_answers_over_tls_only(pki, tmp_path):
    engine = FakeEngine(f"ipc://{tmp_path}/fake-engine.sock")
    proc, url = start_gateway(tmp_path, f"ipc://{tmp_path}/fake-engine.sock", *_flags(pki))
    try:
        assert url.startswith("https://127.0.0.1:")
        status, body = _get(url + "/v1/models", _client(pki, with_cert=False))
        assert status == 200 and body["data"][0]["id"]
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            _get("http://" + url[len("https://"):] + "/v1/models", None)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _get(url + "/v1/models", ssl.create_default_context())  # a client that does not trust the test CA
        status, _ = _get(url + "/v1/models", _client(pki, with_cert=False))  # and the gateway serves on
        assert status == 200
    finally:
        stop(proc)
        engine.close()


def test_client_certificates_when_required(pki, tmp_path):
    engine = FakeEngine(f"ipc://{tmp_path}/fake-engine.sock")
    proc, url = start_gateway(tmp_path, f"ipc://{tmp_path}/fake-engine.sock",
                              *_flags(pki, "--ssl-ca-certs", pki["ca"], "--ssl-cert-reqs", "2"))
    try:
        assert _get(url + "/v1/models", _client(pki, with_cert=True))[0] == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _get(url + "/v1/models", _client(pki, with_cert=False))
    finally:
        stop(proc)
        engine.close()


@pytest.mark.parametrize("flags, words", [
    (["--ssl-keyfile", "/k.pem"], "--ssl-keyfile and --ssl-certfile go together"),
    (["--ssl-cert-reqs", "3"], "--ssl-cert-reqs must be 0"),
    ("cert-reqs-without-ca", "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs"),
    ("unreadable", "--ssl-certfile"),
])
def test_bad_tls_flags_stop_the_gateway_naming_them(pki, flags, words):
    if flags == "cert-reqs-without-ca":
        flags = _flags(pki, "--ssl-cert-reqs", "1")
    elif flags == "unreadable":
        flags = ["--ssl-certfile", pki["ca"], "--ssl-keyfile", pki["client"]]  # a CA's certificate, another's key
    stderr = gateway_refusal(*flags)
    assert words in stderr, stderr


def test_serve_passes_the_flags_on_and_waits_for_its_https_gateway(pki, tmp_path):
    s = start_serve(tmp_path, _flags(pki))
    try:
        assert s.url.startswith("https://127.0.0.1:")
        assert _get(s.url + "/health", _client(pki, with_cert=False)) == (200, {"status": "ok"})
    finally:
        assert stop_serve(s) == 0
