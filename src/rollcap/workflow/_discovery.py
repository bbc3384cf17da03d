"""Finding servers through the head server (``GET /servers``), for agents and harnesses."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

import orjson

from rollcap.ids import validate_rollout_id

__all__ = ["DEFAULT_HEAD_URL", "HEAD_URL_ENV", "list_servers", "resolve_model_base_url"]

DEFAULT_HEAD_URL = "http://127.0.0.1:11000"
# Where the head server is when it is not at the default address.
HEAD_URL_ENV = "ROLLCAP_HEAD_URL"


def head_url() -> str:
    return os.environ.get(HEAD_URL_ENV, DEFAULT_HEAD_URL).rstrip("/")


def list_servers(head: str | None = None, *, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every server the head server knows: ``name``, ``kind``, ``type``, ``url``."""
    url = f"{head or head_url()}/servers"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            servers = orjson.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"cannot reach the head server at {url}: {exc}") from exc
    if not isinstance(servers, list):
        raise ValueError(f"{url} did not answer with a list of servers")
    return [s for s in servers if isinstance(s, dict)]


def resolve_model_base_url(name: str, rollout_id: str, *, head: str | None = None) -> str:
    """``http://host:port/ng-rollout/<rollout_id>/v1`` of the model server called ``name``."""
    validate_rollout_id(rollout_id)
    servers = list_servers(head)
    for server in servers:
        if server.get("name") == name and server.get("kind") == "responses_api_models":
            return f"{str(server['url']).rstrip('/')}/ng-rollout/{rollout_id}/v1"
    known = ", ".join(
        str(s.get("name")) for s in servers if s.get("kind") == "responses_api_models"
    )
    raise ValueError(f"no model server named {name!r} (model servers: {known or 'none'})")
