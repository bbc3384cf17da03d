"""The worker's way to its upstream: one shared aiohttp session, the URL, the headers."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp

from rollcap._proxy.headers import CREDENTIAL_HEADERS, HOP_BY_HOP, forwarding_session
from rollcap.worker._settings import WorkerSettings

__all__ = ["Upstream"]

# The upstream's key comes from the worker's settings, never from its clients.
_REQUEST_DROP = HOP_BY_HOP | CREDENTIAL_HEADERS


class Upstream:
    """A vLLM-compatible chat endpoint, reached over one session opened by ``start``."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._base = settings.upstream_url.rstrip("/")
        self._api_key = settings.api_key
        self._connect_timeout_s = settings.connect_timeout_s
        self._read_timeout_s = settings.read_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = forwarding_session(
            connect_timeout_s=self._connect_timeout_s, read_timeout_s=self._read_timeout_s
        )

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url_for(self, path: str) -> str:
        """Join ``path`` (``/v1/...``) to the base URL, with or without a trailing ``/v1``."""
        if self._base.endswith("/v1") and path.startswith("/v1/"):
            path = path[3:]
        return self._base + path

    def headers(
        self, client_headers: Iterable[tuple[str, str]], *, json_body: bool = False
    ) -> list[tuple[str, str]]:
        """The client's headers as they go upstream. ``json_body``: the worker wrote the body
        itself, so it sets the content type rather than repeating the client's."""
        out = [
            (name, value)
            for name, value in client_headers
            if name.lower() not in _REQUEST_DROP
            and not (json_body and name.lower() == "content-type")
        ]
        if json_body:
            out.append(("content-type", "application/json"))
        # The worker parses what comes back (and the client must get the same bytes).
        out.append(("accept-encoding", "identity"))
        if self._api_key:
            out.append(("authorization", f"Bearer {self._api_key}"))
        return out

    async def open(
        self, method: str, path: str, body: bytes, headers: list[tuple[str, str]]
    ) -> aiohttp.ClientResponse:
        """The upstream's response, headers read; ``TimeoutError`` or ``aiohttp.ClientError``
        when there is none. The caller releases it."""
        assert self._session is not None, "the worker's lifespan did not start"
        return await self._session.request(
            method, self.url_for(path), data=body or None, headers=headers
        )
