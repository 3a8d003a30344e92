"""Ports ``ignis serve`` checks are free before it starts anything.

The gateway binds its HTTP port last, after tierd locked its arena and the
engine loaded the model (minutes on a large checkpoint); a port already
taken would only be found then. ``serve`` binds each TCP port it was given
(the gateway's ``--port``, the engine's ``--metrics-port``,
``--tierd-metrics-port``; 0 picks a free one and is not checked) the way
the process will (``SO_REUSEADDR``, every address the host resolves to),
closes it at once, and refuses to start naming the flag when one cannot be
bound. A port taken between the check and the child's bind is still
reported by that child.
"""

from __future__ import annotations

import socket


def bind_problem(host: str, port: int, first_only: bool = False) -> str | None:
    """Why ``host:port`` cannot be bound now (None: it can). As asyncio's server binds (the gateway): every
    address ``host`` resolves to, IPv6 ones IPv6-only, a family this machine lacks skipped; ``first_only``,
    as the metrics endpoints bind: the first address alone, IPv6 dual-stack."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot resolve {host!r}: {e.strerror or e}"
    for family, kind, proto, _, address in infos[:1] if first_only else infos:
        try:
            s = socket.socket(family, kind, proto)
        except OSError:
            continue  # no such family here (an IPv6 address on a machine without IPv6): not bound either
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and not first_only:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(address)
            except OSError as e:
                return e.strerror or str(e)
    return None


def first_taken(ports: list[tuple[str, str, int | None, bool]]) -> str | None:
    """The first of ``(flag, host, port, first_only)`` whose port cannot be bound, or is given twice, as an
    error line (None: all free)."""
    seen: dict[int, str] = {}
    for flag, host, port, first_only in ports:
        if not port:
            continue
        if port in seen:
            return f"{flag} {port}: the port {seen[port]} takes"
        seen[port] = flag
        problem = bind_problem(host, port, first_only)
        if problem is not None:
            return f"{flag} {port}: cannot listen on {host}:{port}: {problem}"
    return None
