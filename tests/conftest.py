"""Suite-wide guard: no test credential is ever written to a file or a log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

# The credentials the server tests hand to rollcap (upstream) and send as a client.
SECRETS = ("sk-upstream-SECRET-0d9f7e", "sk-client-SECRET-77aa1c")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(autouse=True)
def quiet_websocket_client() -> Iterator[None]:
    """The WebSocket library the SDK's client uses logs its handshake's headers at DEBUG, a test
    client's key among them; what the guard below checks is what rollcap writes and logs."""
    logger = logging.getLogger("websockets.client")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def no_secret_written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
    base: Path = tmp_path_factory.getbasetemp()
    leaks = [
        str(path)
        for path in base.rglob("*")
        if path.is_file()
        and not path.is_symlink()
        and path.name != "env.yaml"  # the credentials file itself, by design
        and any(s.encode() in path.read_bytes() for s in SECRETS)
    ]
    assert not leaks, f"test credentials written to {leaks}"
    logged = "\n".join(handler.lines)
    assert not any(secret in logged for secret in SECRETS), "a test credential reached a log line"
