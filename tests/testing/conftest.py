"""Fixtures for the fake upstream's tests: a running server, and no error logged by aiohttp."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from rollcap.testing import FakeUpstream


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server


@pytest.fixture(autouse=True)
def _no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A failure scenario is the fake doing its job: aiohttp must not log it as an error."""
    caplog.set_level(logging.WARNING, logger="aiohttp")
    yield
    errors = [
        r for r in caplog.get_records("call") if r.name.startswith("aiohttp") and r.levelno >= 30
    ]
    assert not errors, [r.getMessage() for r in errors]
