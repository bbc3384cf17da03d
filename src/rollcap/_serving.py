"""Run ASGI apps under uvicorn on sockets bound up front, so a busy port is a clear error."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

__all__ = ["bind", "uvicorn_server"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``OSError`` (with the address in its message) when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def uvicorn_server(app: Any, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app`` on the fast loop and parser, with no headers of its own.

    The model server forwards the upstream's ``date`` and ``server`` headers; uvicorn's would
    be second copies.
    """
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        access_log=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config)
