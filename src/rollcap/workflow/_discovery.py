"""Finding servers through the head server (``GET /servers``), for agents and harnesses."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

import orjson

from rollcap.affinity import choose_replica
from rollcap.config import ConfigError
from rollcap.ids import validate_rollout_id

__all__ = [
    "DEFAULT_HEAD_URL",
    "HEAD_URL_ENV",
    "find_server",
    "list_servers",
    "replica_urls",
    "resolve_model_base_url",
]

DEFAULT_HEAD_URL = "http://127.0.0.1:11000"
# Where the head server is when it is not at the default address.
HEAD_URL_ENV = "ROLLCAP_HEAD_URL"


def head_url() -> str:
    return os.environ.get(HEAD_URL_ENV, DEFAULT_HEAD_URL).rstrip("/")


def list_servers(head: str | None = None, *, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every server the head server knows: ``name``, ``kind``, ``type``, ``url``.

    A model server run as replicas on a cluster (``rollcap env start --ray``) also has
    ``replicas``: the live ones, each ``{"url", "node_id"}``; its ``url`` is one of them.
    """
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
    """``http://host:port/ng-rollout/<rollout_id>/v1`` of the model server called ``name``.

    When the server runs as replicas, the URL is the one replica the rollout sticks to
    (``rollcap.affinity.choose_replica`` over the live replicas' URLs), so that all of a
    rollout's calls go to one replica.
    """
    validate_rollout_id(rollout_id)
    server = find_server(list_servers(head), name, "responses_api_models")
    replicas = replica_urls(server)
    base = choose_replica(rollout_id, replicas) if replicas else str(server["url"])
    return f"{base.rstrip('/')}/ng-rollout/{rollout_id}/v1"


def find_server(servers: list[dict[str, Any]], name: str, kind: str) -> dict[str, Any]:
    """The ``list_servers`` entry of the ``kind`` server called ``name``.

    Raises ``ConfigError`` naming the servers of that kind there are.
    """
    for server in servers:
        if server.get("name") == name and server.get("kind") == kind:
            return server
    known = ", ".join(str(s.get("name")) for s in servers if s.get("kind") == kind)
    raise ConfigError(f"no {kind} server named {name!r} (have: {known or 'none'})")


def replica_urls(server: dict[str, Any]) -> list[str]:
    """The URLs of a ``list_servers`` entry's live replicas (none for a single server)."""
    replicas = server.get("replicas")
    if not isinstance(replicas, list):
        return []
    return [str(r["url"]) for r in replicas if isinstance(r, dict) and r.get("url")]
