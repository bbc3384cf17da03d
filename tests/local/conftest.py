"""The embedded model, loaded once for the session, and servers in front of it on real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollcap._runtime.serving import serving_in_thread
from rollcap.local import LocalEngine, create_chat_app
from rollcap.server import ModelServerSettings, create_model_app


@pytest.fixture(scope="session")
def engine() -> Iterator[LocalEngine]:
    pytest.importorskip("llama_cpp", reason="the local extra is not installed")
    loaded = LocalEngine.load()
    try:
        yield loaded
    finally:
        loaded.close()


@pytest.fixture(scope="session")
def chat_url(engine: LocalEngine) -> Iterator[str]:
    """The embedded chat server alone (base URL, no ``/v1``)."""
    with serving_in_thread(create_chat_app(engine)) as url:
        yield url


@dataclass(frozen=True)
class LocalModelServer:
    url: str
    capture_dir: Path


@pytest.fixture(scope="session")
def local_model_server(
    engine: LocalEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalModelServer]:
    """A capturing ``local_model`` model server: it starts its own embedded chat server.

    ``engine`` is asked for only so that the server is skipped with it when the extra is missing.
    """
    capture_dir = tmp_path_factory.mktemp("capture")
    settings = ModelServerSettings(model_type="local_model", base_url=None, capture_dir=capture_dir)
    with serving_in_thread(create_model_app(settings)) as url:
        yield LocalModelServer(url, capture_dir)
