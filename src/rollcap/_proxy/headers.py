"""What the servers that forward HTTP (the model server, the capture worker) share.

Which headers never cross a proxy, and the one kind of client session they forward with.
"""

from __future__ import annotations

import aiohttp

__all__ = ["CREDENTIAL_HEADERS", "HOP_BY_HOP", "RESPONSE_DROP", "forwarding_session"]

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


def forwarding_session(*, connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    """One session for all of a server's upstream calls: unbounded pool, bytes as they came.

    ``read_timeout_s`` is the longest silence between two upstream bytes, not a total: a long
    generation that keeps streaming is never cut.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        ),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )
