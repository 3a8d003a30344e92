"""TLS for the gateway's HTTP server (vLLM's ``--ssl-keyfile``, ``--ssl-certfile``, ``--ssl-ca-certs``,
``--ssl-cert-reqs``).

With a certificate and its key the gateway speaks HTTPS only (its READY line
and log say ``https://``); with ``--ssl-ca-certs`` it can ask clients for
certificates signed by those CAs: ``--ssl-cert-reqs`` 0 none (default), 1
optional, 2 required (Python's ``ssl.CERT_*`` numbers, as vLLM takes them).
TLS 1.2 at least, the ``ssl`` module's default ciphers. A TLS handshake must
end within ``--header-read-timeout``, as a request's headers must. A file that
does not load stops the gateway at start, naming the flag.
"""

from __future__ import annotations

import ssl

CERT_REQS = {0: ssl.CERT_NONE, 1: ssl.CERT_OPTIONAL, 2: ssl.CERT_REQUIRED}


def check_tls_flags(keyfile: str | None, certfile: str | None, ca_certs: str | None, cert_reqs: int) -> None:
    """The flags make sense together (their files are read by ``server_context``)."""
    if (keyfile is None) != (certfile is None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together: the server's key and its certificate")
    if cert_reqs not in CERT_REQS:
        raise ValueError(f"--ssl-cert-reqs must be 0 (no client certificate), 1 (optional) or 2 (required), "
                         f"got {cert_reqs!r}")
    if (cert_reqs or ca_certs) and certfile is None:
        raise ValueError("--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile and --ssl-keyfile")
    if cert_reqs and ca_certs is None:
        raise ValueError("--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs: the CAs client certificates are checked "
                         "against")


def server_context(keyfile: str | None, certfile: str | None, ca_certs: str | None = None,
                   cert_reqs: int = 0) -> ssl.SSLContext | None:
    """The server's TLS context (None: plain HTTP); raises ValueError naming the flag whose file fails."""
    check_tls_flags(keyfile, certfile, ca_certs, cert_reqs)
    if certfile is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: cannot load: {e}") from None
    if ca_certs is not None:
        try:
            ctx.load_verify_locations(ca_certs)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"--ssl-ca-certs {ca_certs}: cannot load: {e}") from None
    ctx.verify_mode = CERT_REQS[cert_reqs]
    return ctx
