"""``rollcap capture view``: the report page served live from a run's files (I/O shell).

The page is the report's, with no data in it: it asks a small JSON API instead and polls the
summary, so rollouts that land while it is open appear.

- ``GET /api/summary``: the summary (as in the report), plus ``revision``, which changes when
  any file of the run does.
- ``GET /api/rollout/<rollout_id>``: one rollout's payload (each call's delta and answer).
- ``GET /api/rollout/<rollout_id>/tokens``: its token view (with a staging directory): the
  staged calls, their chains verified, and the gate's manifest when its ledger is there.
- ``GET /api/rollout/<rollout_id>/call/<position>/raw``: one call's raw texts (the raw SSE).
- ``GET /api/search?q=<words>``: the ids of the rollouts whose prompts, answers, tool calls and
  results hold every word (``matches_search``).
- ``GET /api/diverge/<rollout_id>/<rollout_id>``: what first differs between two rollouts
  (``_diverge.explain``; ``null`` when nothing does).

Files are read lazily: a summary keeps a few numbers per call, recomputed only for the files
whose size, time or marker changed, and a payload is read when it is asked for. Ids from the URL
are validated (``rollcap.ids``) before any path is built from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rollcap.ids import validate_rollout_id
from rollcap.report._diverge import explain
from rollcap.report._embed import VIEW_CSP
from rollcap.report._model import (
    RolloutDigest,
    RolloutInput,
    RolloutLine,
    build_summary,
    call_shapes,
    digest_rollout,
    matches_search,
)
from rollcap.report._report import PageAssets, load_assets
from rollcap.report._source import (
    RunFiles,
    read_rollout,
    read_rollout_lines,
    read_tokens,
    rollout_order,
    valid_ids,
)
from rollcap.status import StatusSource, StatusUnavailable
from rollcap.store import CaptureStore

__all__ = ["RunIndex", "create_view_app", "host_name"]

_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_NO_STORE = {"cache-control": "no-store"}

_FileKey = tuple[int, int, bool, RolloutLine | None]


def _file_key(path: str, marker: str, line: RolloutLine | None) -> _FileKey:
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    except OSError:
        size, mtime = -1, -1
    return size, mtime, os.path.exists(marker), line


@dataclass(frozen=True, slots=True)
class _Summary:
    revision: str
    body: bytes


class RunIndex:
    """A run's summary, kept up to date one changed file at a time. Thread-safe; blocks."""

    def __init__(self, run: RunFiles) -> None:
        self.run = run
        self.store = CaptureStore(run.capture_dir)
        self._lock = threading.Lock()
        self._digests: dict[str, tuple[_FileKey, RolloutDigest]] = {}
        self._lines_key: tuple[int, ...] | None = None
        self._lines: tuple[dict[str, RolloutLine], list[Any]] = ({}, [])
        self._summary: _Summary | None = None

    def _rollout_lines(self) -> tuple[dict[str, RolloutLine], list[Any]]:
        key: list[int] = []
        for path in (self.run.rollouts_file, self.run.failures_file):
            try:
                st = os.stat(path) if path is not None else None
            except OSError:
                st = None
            key.extend((-1, -1) if st is None else (st.st_size, st.st_mtime_ns))
        if tuple(key) != self._lines_key:
            self._lines = read_rollout_lines(self.run)
            self._lines_key = tuple(key)
        return self._lines

    def summary(self) -> tuple[str, bytes]:
        """The revision and the summary's JSON; rebuilt only when some file changed."""
        with self._lock:
            lines, line_notes = self._rollout_lines()
            ids, bad_names = valid_ids(self.store.rollout_ids())
            order = rollout_order(set(ids) | set(lines), lines)
            digests: dict[str, tuple[_FileKey, RolloutDigest]] = {}
            changed = set(order) != set(self._digests)
            for rollout_id in order:
                line = lines.get(rollout_id)
                key = _file_key(
                    str(self.store.file_for(rollout_id)),
                    str(self.store.marker_for(rollout_id)),
                    line,
                )
                known = self._digests.get(rollout_id)
                if known is None or known[0] != key:
                    source = read_rollout(self.store, rollout_id, line)
                    known = (key, digest_rollout(source, payload=False))
                    changed = True
                digests[rollout_id] = known
            self._digests = digests
            if self._summary is None or changed:
                revision = hashlib.sha256(
                    orjson.dumps([[r, list(digests[r][0][:3])] for r in order])
                    + orjson.dumps(self._lines_key)
                ).hexdigest()[:16]
                summary = build_summary(
                    [digests[r][1] for r in order],
                    source=self.run.describe(),
                    notes=[*line_notes, *bad_names],
                )
                summary["revision"] = revision
                self._summary = _Summary(revision, orjson.dumps(summary))
            return self._summary.revision, self._summary.body

    def _source(self, rollout_id: str) -> RolloutInput | None:
        """The rollout as read; ``None`` when the run has no such rollout."""
        with self._lock:
            lines, _ = self._rollout_lines()
        if rollout_id not in lines and not self.store.has_capture(rollout_id):
            return None
        return read_rollout(self.store, rollout_id, lines.get(rollout_id))

    def payload(self, rollout_id: str) -> dict[str, Any] | None:
        """One rollout's payload; ``None`` when the run has no such rollout."""
        source = self._source(rollout_id)
        return None if source is None else digest_rollout(source).payload

    def search(self, query: str) -> list[str]:
        """The ids of the rollouts (of the last summary) that ``matches_search`` the query."""
        with self._lock:
            digests = [digest for _, digest in self._digests.values()]
        return [d.rollout_id for d in digests if matches_search(d.text, query)]

    def diverge(self, a: str, b: str) -> tuple[bool, dict[str, Any] | None]:
        """Whether both rollouts exist, and what first differs between them."""
        sources = [self._source(a), self._source(b)]
        if sources[0] is None or sources[1] is None:
            return False, None
        return True, explain(call_shapes(sources[0]), call_shapes(sources[1]))

    def raw(self, rollout_id: str, position: int) -> dict[str, Any] | None:
        """One call's raw texts (``{}`` when it has none); ``None`` when there is no such call."""
        records = read_rollout(self.store, rollout_id, None).records
        if not 0 <= position < len(records):
            return None
        record = records[position][1]
        return {
            key: record[key]
            for key in ("request_raw", "response_raw")
            if isinstance(record.get(key), str)
        }

    def tokens(self, rollout_id: str) -> dict[str, Any] | None:
        if self.run.staging_dir is None:
            return None
        return read_tokens(self.run.staging_dir, rollout_id, ledger_dir=self.run.ledger_root)

    def close(self) -> None:
        self.store.close()


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port; an IPv6 address keeps its brackets."""
    if header.startswith("["):
        return header[: header.find("]") + 1].lower()
    return header.split(":", 1)[0].lower()


class _KnownHostsOnly:
    """Answers 400 to a request whose ``Host`` is not one of ``allowed`` (``None``: any)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.allowed is not None:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(header) not in self.allowed:
                await PlainTextResponse("Invalid host header", 400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _json(value: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(value), status_code=status, media_type="application/json", headers=_NO_STORE
    )


def _rollout_id(request: Request) -> str | Response:
    try:
        return validate_rollout_id(request.path_params["rollout_id"])
    except ValueError as exc:
        return _json({"error": str(exc)}, 400)


def create_view_app(
    run: RunFiles,
    *,
    host: str = "127.0.0.1",
    assets: PageAssets | None = None,
    live: StatusSource | None = None,
) -> Starlette:
    """The served view of ``run``. Requests must name ``host`` (or a loopback name) in their
    ``Host`` header, so a web page elsewhere cannot read the run through DNS rebinding.

    ``live``: where the page's live panel reads the run's status (``GET /api/live``:
    ``{"source", "runs", "error"}``); ``None``: the page has no live panel.
    """
    index = RunIndex(run)
    page = (assets or load_assets()).page(
        {"mode": "served", "live": live is not None},
        csp=VIEW_CSP,
        title=f"rollcap view: {run.capture_dir}",
    )

    async def live_status(request: Request) -> Response:
        if live is None:
            return _json({"error": "this view was started without a live status source"}, 404)
        try:
            runs = await asyncio.to_thread(live.fetch)
        except StatusUnavailable as exc:
            return _json({"source": str(live), "runs": [], "error": str(exc)})
        return _json({"source": str(live), "runs": runs, "error": None})

    async def home(request: Request) -> Response:
        return HTMLResponse(page, headers=_NO_STORE)

    async def summary(request: Request) -> Response:
        revision, body = await asyncio.to_thread(index.summary)
        headers = {**_NO_STORE, "etag": f'"{revision}"'}
        return Response(body, media_type="application/json", headers=headers)

    async def rollout(request: Request) -> Response:
        rollout_id = _rollout_id(request)
        if isinstance(rollout_id, Response):
            return rollout_id
        payload = await asyncio.to_thread(index.payload, rollout_id)
        if payload is None:
            return _json({"error": f"no rollout {rollout_id}"}, 404)
        return _json(payload)

    async def tokens(request: Request) -> Response:
        rollout_id = _rollout_id(request)
        if isinstance(rollout_id, Response):
            return rollout_id
        return _json(await asyncio.to_thread(index.tokens, rollout_id))

    async def raw(request: Request) -> Response:
        rollout_id = _rollout_id(request)
        if isinstance(rollout_id, Response):
            return rollout_id
        position: int = request.path_params["position"]
        texts = await asyncio.to_thread(index.raw, rollout_id, position)
        if texts is None:
            return _json({"error": f"no call {position} in rollout {rollout_id}"}, 404)
        return _json(texts)

    async def search(request: Request) -> Response:
        query = request.query_params.get("q", "")
        await asyncio.to_thread(index.summary)  # the texts of rollouts that landed since
        return _json({"q": query, "ids": await asyncio.to_thread(index.search, query)})

    async def diverge(request: Request) -> Response:
        ids = []
        for key in ("a", "b"):
            try:
                ids.append(validate_rollout_id(request.path_params[key]))
            except ValueError as exc:
                return _json({"error": str(exc)}, 400)
        found, why = await asyncio.to_thread(index.diverge, ids[0], ids[1])
        if not found:
            return _json({"error": f"no rollout {ids[0]} or {ids[1]}"}, 404)
        return _json(why)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            index.close()

    # Bound to every interface, the user chose to be reached by any name.
    hosts = None
    if host not in ("0.0.0.0", "::"):
        hosts = frozenset({*_LOOPBACK_HOSTS, f"[{host}]" if ":" in host else host.lower()})
    return Starlette(
        routes=[
            Route("/", home),
            Route("/api/summary", summary),
            Route("/api/rollout/{rollout_id}", rollout),
            Route("/api/rollout/{rollout_id}/tokens", tokens),
            Route("/api/rollout/{rollout_id}/call/{position:int}/raw", raw),
            Route("/api/search", search),
            Route("/api/diverge/{a}/{b}", diverge),
            Route("/api/live", live_status),
        ],
        middleware=[Middleware(_KnownHostsOnly, allowed=hosts)],
        lifespan=lifespan,
    )
