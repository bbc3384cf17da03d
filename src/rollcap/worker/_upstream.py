"""The worker's way to its upstream: one shared aiohttp session, the URL, the headers."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp

from rollcap._proxy.forward import forwarding_session, open_upstream
from rollcap._proxy.headers import outgoing, upstream_url
from rollcap.worker._settings import WorkerSettings

__all__ = ["Upstream"]


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

    def url_for(self, path: str, query: str = "") -> str:
        return upstream_url(self._base, path, query)

    def headers(
        self, client_headers: Iterable[tuple[str, str]], *, json_body: bool = False
    ) -> list[tuple[str, str]]:
        """The client's headers as they go upstream, the worker's key instead of the client's.
        ``json_body``: the worker wrote the body itself, so it sets the content type."""
        auth = ("authorization", f"Bearer {self._api_key}") if self._api_key else None
        return outgoing(
            client_headers, auth=auth, content_type="application/json" if json_body else None
        )

    async def open(
        self,
        method: str,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        query: str = "",
    ) -> aiohttp.ClientResponse:
        """The upstream's response, headers read; ``UpstreamFailure`` when there is none.
        The caller releases it."""
        assert self._session is not None, "the worker's lifespan did not start"
        url = self.url_for(path, query)
        return await open_upstream(self._session, method, url, body or None, headers)
