"""Which headers cross a proxy, each way, for the servers that forward (model server, worker).

``outgoing`` is the client's request headers as they go upstream; ``for_client`` is upstream's
response headers as they go back; ``upstream_url`` joins a call's path to an upstream's base URL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "CREDENTIAL_HEADERS",
    "HOP_BY_HOP",
    "RESPONSE_DROP",
    "for_client",
    "outgoing",
    "upstream_url",
]

# Never forwarded from client to upstream: hop-by-hop headers and ones aiohttp sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
    }
)
# A client's credentials: upstream keys come from configuration, never from these.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie"})
# Never forwarded from upstream to client: framing is the forwarding server's own business.
RESPONSE_DROP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "trailer"}
)
_REWRITTEN_DROP = RESPONSE_DROP | {"content-type", "content-encoding"}


def outgoing(
    client_headers: Iterable[tuple[str, str]],
    *,
    auth: tuple[str, str] | None = None,
    pass_client_credentials: bool = False,
    content_type: str | None = None,
) -> list[tuple[str, str]]:
    """The client's headers as they go upstream.

    Hop-by-hop headers are dropped, and the client's credentials unless they are passed on;
    ``auth`` is the upstream's own credential header. ``content_type``: the forwarder wrote the
    body itself, so its type replaces the client's. Upstream is asked for identity encoding:
    what comes back is parsed, and the client must get the same bytes.
    """
    drop = HOP_BY_HOP if pass_client_credentials else HOP_BY_HOP | CREDENTIAL_HEADERS
    out = [(name, value) for name, value in client_headers if name.lower() not in drop]
    if content_type is not None:
        out = [(name, value) for name, value in out if name.lower() != "content-type"]
        out.append(("content-type", content_type))
    out.append(("accept-encoding", "identity"))
    if auth is not None:
        out.append(auth)
    return out


def for_client(upstream_headers: Mapping[str, str], *, rewritten: bool = False) -> dict[str, str]:
    """Upstream's response headers as they go to the client; ``rewritten``: the forwarder
    changed the body, so its own content type (and encoding) stand."""
    drop = _REWRITTEN_DROP if rewritten else RESPONSE_DROP
    return {k: v for k, v in upstream_headers.items() if k.lower() not in drop}


def upstream_url(base_url: str, path: str, query: str = "") -> str:
    """Join ``path`` (``/v1/...``) to an upstream's base URL, with or without a trailing ``/v1``."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path + (f"?{query}" if query else "")
