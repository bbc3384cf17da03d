"""``collect``: run every planned rollout against an agent server and write the results.

The shape of one run::

    input lines --plan (lazy)--> workers (a fixed pool, one aiohttp session)
        worker: journal the rollout-attempt (fsynced, in batches), clear + mark its capture
                -> dispatch: POST /run (timed) -> the line with its evidence
                (``rollout_line``, reading the capture once, in a thread) -> bounded queue
    queue --> one writer task: encode + append + flush, in a thread
    end:  read the output back, sort it by (task, rollout), aggregate, write the metrics file

Dispatch is ``run_rollout`` against the agent's URL, or what the caller hands in: collection
across a cluster (``rollcap.cluster``) runs the same ``run_rollout`` on the nodes, so a line
built there carries the same evidence as one built here. A dispatch
that comes back *lost* (its worker, node or model server died with it) wrote nothing: the
rollout runs again at once under the next attempt id, up to ``lost_retries`` times, and is
otherwise left to ``--resume``.

Memory stays flat in the number of tasks: the plan is a generator over the input file, the
workers hold one rollout each, the queue is bounded, and the final pass keeps a few numbers per
line (its indices, model latency and ``ng_perf``), never a line's payloads.

A run that is killed leaves whole lines (each is one write) or at worst a torn last line, which
a resumed run cuts off before appending. See ``_plan`` for how attempts are counted.

An output named ``X.jsonl.zst`` is Zstandard frames (``rollcap.store``'s ``FrameWriter``): each
flushed batch is one complete frame, so a killed run leaves whole frames or at worst a last
frame cut short, which a resumed run cuts off as it cuts a torn line; a corrupt frame stops the
resume instead (lines appended behind it could never be read back in order). Its sidecars
(failures, journal, status, metrics) are plain and named after ``X.jsonl``. With
``compress_capture_level`` each rollout's capture file is compacted into
``<rollout_id>.capture.jsonl.zst`` once its line is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson

from rollcap._runtime.batch import BatchThread, call_each
from rollcap.collect._aggregate import ENVIRONMENT_SERVER_KEY, AggregateMetrics, CollectionSummary
from rollcap.collect._compact import CaptureCompactor
from rollcap.collect._journal import DispatchJournal, dispatched_path
from rollcap.collect._lines import (
    AgentAnswerError,
    check_agent_answer,
    failure_line,
    has_evidence,
    rollout_line,
)
from rollcap.collect._plan import (
    RequestParams,
    ResumeState,
    Rollout,
    aggregate_metrics_path,
    count_tasks,
    failures_path,
    iter_tasks,
    plan_rollouts,
    planned_count,
    rollout_line_ids,
)
from rollcap.status import LiveStatus, RunBoard, StatusOptions, status_path
from rollcap.store import (
    CAPTURE_SUFFIX,
    COMPRESSED_CAPTURE_SUFFIX,
    INCOMPLETE_SUFFIX,
    CaptureStore,
    FrameWriter,
    LineBatches,
    check_level,
    is_compressed,
    iter_lines,
    whole_frames_length,
)

__all__ = [
    "AgentCall",
    "Dispatch",
    "ProgressCallback",
    "RolloutOutcome",
    "collect",
    "http_agent",
    "run_rollout",
]

log = logging.getLogger("rollcap.collect")

ProgressCallback = Callable[[int, int, int], None]
"""Called with ``(done, failed, total)`` for this run: at the start and after each rollout.

``done`` counts finished rollouts, failed ones included; ``total`` excludes those an earlier
run finished.
"""

_ERROR_BODY_LIMIT = 2000  # characters of a non-JSON error body kept in the failures file
_OK, _FAILED = 0, 1
_STOP = object()
# A line on its way to the writer: encoded (newline included), or its JSON object.
Line = bytes | Mapping[str, Any]
# What an agent answers when it could not reach its model server at all (the gym's agents).
_MODEL_UNREACHABLE_STATUSES = (502, 504)


@dataclass(frozen=True, slots=True)
class RolloutOutcome:
    """How one dispatch of a rollout ended, as plain data (it crosses process boundaries).

    ``kind``: ``"ok"`` (``line`` is the output line), ``"failed"`` (``line`` is the failures
    line) or ``"lost"`` (nothing to write: what ran it died; ``reason`` says what). Lines are
    encoded, newline included; from ``run_rollout(..., encode=False)`` the line is ``value``
    instead, its JSON object, left for the collector's writer to encode (``line`` is empty).
    ``model_unreachable``: the agent failed because it could not reach its model server,
    which a dispatcher may know to be dead.
    """

    kind: str
    line: bytes = b""
    reason: str = ""
    model_unreachable: bool = False
    value: Mapping[str, Any] | None = None

    OK = "ok"
    FAILED = "failed"
    LOST = "lost"

    @classmethod
    def lost(cls, reason: str) -> RolloutOutcome:
        return cls(cls.LOST, reason=reason)


AgentCall = Callable[[bytes], Awaitable[tuple[int, bytes]]]
"""How a ``/run`` body reaches an agent (``http_agent``, or an app called in-process): the
answer's status and body. ``TimeoutError`` or ``aiohttp.ClientError`` when none came."""

Dispatch = Callable[[Rollout], Awaitable[RolloutOutcome]]
"""Runs one rollout attempt somewhere and says how it ended; never raises for the rollout's
own failures (those are ``"failed"`` outcomes). Its capture is already reset when called."""


class _RolloutFailed(Exception):
    def __init__(
        self, kind: str, message: str, *, model_unreachable: bool = False, **detail: Any
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail
        self.model_unreachable = model_unreachable


async def collect(
    agent_url: str | None,
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    capture_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    num_repeats: int = 1,
    concurrency: int = 16,
    resume: bool = False,
    progress: ProgressCallback | None = None,
    request_timeout: float | None = None,
    agent_name: str = "agent",
    dispatch: Dispatch | None = None,
    lost_retries: int = 1,
    request_params: RequestParams | None = None,
    status: StatusOptions | None = None,
    compress_capture_level: int | None = None,
) -> CollectionSummary:
    """Collect the rollouts of ``input_path`` from the agent at ``agent_url`` (its base URL).

    With ``capture_dir`` (the model servers' ``model_call_capture_dir``) each line gets
    ``ng_model_call_capture``, ``ng_trajectory`` and ``ng_perf``, and every attempt is written
    to the dispatch journal before it runs; without it, a line gets ``ng_trajectory`` when the
    agent answered evidence of its own (``rollout_line``). Without ``resume`` the output,
    failures and journal files are started afresh; with it, rollouts the output already holds
    are skipped and the others run again under a new attempt id. ``request_timeout`` bounds
    one ``/run`` call in seconds (``None``: no bound). ``agent_name`` names the agent in the
    metrics file. ``dispatch`` replaces the call of ``agent_url`` (then ``None``); a rollout it
    loses runs again at once under the next attempt id, at most ``lost_retries`` times.
    ``request_params`` set each rollout's ``responses_create_params`` (``RequestParams``); its
    line then holds them as they were sent. The run's live status (``rollcap.status``) is kept
    in ``<output stem>_status.json`` about once a second, as ``status`` says (default: the
    default thresholds, no model server asked, no head server told). Bad input raises
    ``InputError`` before anything is dispatched.

    An ``output_path`` ending ``.zst`` is written as Zstandard frames (see the module
    docstring); a resume of one whose frames do not decode raises ``CompressedFileError``
    before anything is dispatched. ``compress_capture_level`` (1..22; ``None``: off) compacts
    each rollout's capture once its line is built (``CaptureStore.compact``); a compaction
    that fails is logged and leaves the plain file, the rollout is not failed for it. It is
    this collector's setting: a ``dispatch`` that runs rollouts elsewhere (a cluster's
    workers) must be given it itself.
    """
    if (agent_url is None) == (dispatch is None):
        raise ValueError("collect needs exactly one of agent_url and dispatch")
    if lost_retries < 0:
        raise ValueError(f"lost_retries must be at least 0, not {lost_retries}")
    if num_repeats < 1:
        raise ValueError(f"num_repeats must be at least 1, not {num_repeats}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0, not {limit}")
    if compress_capture_level is not None:
        check_level(compress_capture_level)
    run = _Run(
        agent_url=agent_url,
        dispatch=dispatch,
        lost_retries=lost_retries,
        input_path=Path(input_path),
        output_path=Path(output_path),
        store=None if capture_dir is None else CaptureStore(capture_dir),
        limit=limit,
        num_repeats=num_repeats,
        concurrency=concurrency,
        resume=resume,
        progress=progress,
        request_timeout=request_timeout,
        agent_name=agent_name,
        request_params=request_params,
        status=status,
        compress_level=compress_capture_level,
    )
    try:
        return await run.execute()
    except BaseExceptionGroup as group:
        raise _first_error(group) from None


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error that ended the run, rather than the cancellations it caused."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for leaf in leaves:
        if not isinstance(leaf, asyncio.CancelledError):
            return leaf
    return leaves[0]


class _Run:
    def __init__(
        self,
        *,
        agent_url: str | None,
        dispatch: Dispatch | None,
        lost_retries: int,
        input_path: Path,
        output_path: Path,
        store: CaptureStore | None,
        limit: int | None,
        num_repeats: int,
        concurrency: int,
        resume: bool,
        progress: ProgressCallback | None,
        request_timeout: float | None,
        agent_name: str,
        request_params: RequestParams | None = None,
        status: StatusOptions | None = None,
        compress_level: int | None = None,
    ) -> None:
        self.run_url = None if agent_url is None else agent_url.rstrip("/") + "/run"
        self.dispatch = dispatch
        self.lost_retries = lost_retries
        self.input_path = input_path
        self.output_path = output_path
        self.failures_path = failures_path(output_path)
        self.journal = DispatchJournal(dispatched_path(output_path)) if store is not None else None
        self.metrics_path = aggregate_metrics_path(output_path)
        self.store = store
        self.limit = limit
        self.num_repeats = num_repeats
        self.concurrency = concurrency
        self.resume = resume
        self.progress = progress
        self.timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=30)
        self.agent_name = agent_name
        self.request_params = request_params
        self.status = status or StatusOptions()
        self.compactor = (
            None
            if store is None or compress_level is None
            else CaptureCompactor(store, compress_level)
        )
        self.board: RunBoard | None = None
        self.total = 0
        self.done = 0
        self.failed = 0
        self.lost = 0
        # This run's failures per environment server (JSON of the server -> server, count).
        self.failed_by_server: dict[bytes, tuple[Any, int]] = {}
        # The capture's file work of every rollout (clear before, read after) goes through one
        # thread in batches: a thread-pool hand-off per rollout can cost more than the work.
        self.io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any] = BatchThread(
            call_each, "rollcap-collect-io"
        )
        # Attempts are journaled in batches: one write and one fsync for all that start at once.
        self.starts: BatchThread[Rollout, None] = BatchThread(self._start_all, "rollcap-start")
        # Bounded, so that a slow disk holds the workers back instead of growing memory.
        self.queue: asyncio.Queue[tuple[int, Line] | object] = asyncio.Queue(2 * concurrency)

    async def execute(self) -> CollectionSummary:
        num_tasks = await asyncio.to_thread(self._count_input)
        state = await asyncio.to_thread(self._prepare_files)
        self.total, skipped = planned_count(num_tasks, self.num_repeats, state)
        self._report()
        self.board = RunBoard(
            self.status.settings,
            run_id=str(self.output_path.resolve()),
            agent=self.agent_name,
            planned=self.total,
            skipped=skipped,
            started=time.monotonic(),
            started_at=time.time(),
        )
        async with LiveStatus(
            self.board,
            status_path(self.output_path),
            servers=self.status.servers,
            head_url=self.status.head_url,
            sinks=self.status.sinks,
        ):
            if self.total:
                with open(self.input_path, "rb") as source:
                    plan = plan_rollouts(
                        iter_tasks(source, self.limit), self.num_repeats, state, self.request_params
                    )
                    await self._dispatch(plan)
        metrics, entries = await asyncio.to_thread(self._finish)
        return CollectionSummary(
            output_path=self.output_path,
            failures_path=self.failures_path,
            metrics_path=self.metrics_path,
            total=self.total + skipped,
            ran=self.done,
            failed=self.failed,
            skipped=skipped,
            metrics=metrics,
            lost=self.lost,
            aggregate_metrics=entries,
        )

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.failed, self.total)

    # -- before: input, files, resume state (blocking, run in a thread) --

    def _count_input(self) -> int:
        with open(self.input_path, "rb") as source:
            return count_tasks(source, self.limit)

    def _prepare_files(self) -> ResumeState | None:
        self.output_path.parent.mkdir(parents=True, exist_ok=True)
        if self.store is not None:
            self.store.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        journal = dispatched_path(self.output_path)
        if not self.resume:
            self.output_path.write_bytes(b"")
            self.failures_path.unlink(missing_ok=True)
            journal.unlink(missing_ok=True)
            return None
        # The output first: a corrupt frame there stops the resume with nothing changed.
        _cut_torn_end(self.output_path)
        for path in (self.failures_path, journal):
            _cut_torn_tail(path)
        names: list[str] = []
        if self.store is not None:
            names = [
                name
                for name in os.listdir(self.store.directory)
                if name.endswith((CAPTURE_SUFFIX, COMPRESSED_CAPTURE_SUFFIX, INCOMPLETE_SUFFIX))
            ]
        with contextlib.ExitStack() as stack:
            output = _lines_of(stack, self.output_path)
            failures = _lines_of(stack, self.failures_path)
            dispatched = _lines_of(stack, journal)
            state = ResumeState.from_files(output, failures, names, dispatched)
        if state.bad_output_lines:
            log.warning(
                "%s: %d lines are not rollout lines; their rollouts run again",
                self.output_path,
                state.bad_output_lines,
            )
        return state

    # -- during: workers and the writer --

    async def _dispatch(self, plan: Iterator[Rollout]) -> None:
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session,
            _Writer(self.output_path, self.failures_path) as writer,
        ):
            dispatch = self.dispatch
            if dispatch is None:
                assert self.run_url is not None
                agent = http_agent(session, self.run_url)

                async def dispatch(rollout: Rollout) -> RolloutOutcome:
                    return await run_rollout(
                        agent, rollout, self.store, self.io, compactor=self.compactor, encode=False
                    )

            async def work() -> None:
                # next() never awaits, so the workers can share one generator.
                for rollout in plan:
                    await self._run_one(dispatch, rollout)

            async def workers() -> None:
                async with asyncio.TaskGroup() as group:
                    for _ in range(min(self.concurrency, self.total)):
                        group.create_task(work())
                await self.queue.put(_STOP)

            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(writer.drain(self.queue))
                    group.create_task(workers())
            finally:
                await asyncio.to_thread(self.io.close)
                if self.compactor is not None:
                    await asyncio.to_thread(self.compactor.close)
                await asyncio.to_thread(self.starts.close)
                if self.journal is not None:
                    self.journal.close()

    async def _run_one(self, dispatch: Dispatch, rollout: Rollout) -> None:
        board = self.board
        assert board is not None
        for retry in range(self.lost_retries + 1):
            if retry:
                rollout = replace(rollout, attempt_index=rollout.attempt_index + 1)
            if self.store is not None:
                await self.starts.submit(rollout)
            board.start(
                rollout.rollout_id,
                task_index=rollout.task_index,
                rollout_index=rollout.rollout_index,
                attempt=rollout.attempt_index,
                redispatched=retry > 0,
                now=time.monotonic(),
            )
            outcome = await dispatch(rollout)
            board.end(rollout.rollout_id, outcome.kind, time.monotonic())
            if outcome.kind != RolloutOutcome.LOST:
                break
            log.warning("rollout %s was lost: %s", rollout.rollout_id, outcome.reason)
        line = outcome.line if outcome.value is None else outcome.value
        if outcome.kind == RolloutOutcome.OK:
            await self.queue.put((_OK, line))
        elif outcome.kind == RolloutOutcome.FAILED:
            await self.queue.put((_FAILED, line))
            self.failed += 1
            self._failed_on(rollout.task.get(ENVIRONMENT_SERVER_KEY))
        else:
            # Written nowhere: a resumed run gives it the attempt after this one.
            self.lost += 1
        self.done += 1
        self._report()

    def _failed_on(self, environment_server: Any) -> None:
        key = orjson.dumps(environment_server, option=orjson.OPT_SORT_KEYS)
        _, count = self.failed_by_server.get(key, (environment_server, 0))
        self.failed_by_server[key] = (environment_server, count + 1)

    def _start_all(self, rollouts: list[Rollout]) -> Sequence[BaseException | None]:
        """Journal a batch of attempts (one write, one fsync), then clear + mark each capture."""
        assert self.journal is not None
        assert self.store is not None
        try:
            self.journal.record(rollouts)
        except Exception as exc:
            return [exc] * len(rollouts)
        return call_each([(_start_capture, (self.store, r.rollout_id)) for r in rollouts])

    # -- after: sort and aggregate (blocking, run in a thread) --

    def _finish(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        accumulator = AggregateMetrics(capture=self.store is not None)
        for server, count in self.failed_by_server.values():
            accumulator.add_failure(server, count)
        self._sort_output(accumulator)
        entries = accumulator.entries(self.agent_name)
        tmp = self.metrics_path.with_name(self.metrics_path.name + ".tmp")
        tmp.write_bytes(
            orjson.dumps(entries, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
        )
        os.replace(tmp, self.metrics_path)
        return accumulator.overall.result(), entries

    def _sort_output(self, accumulator: AggregateMetrics) -> None:
        """Rewrite the output sorted by (task, rollout), each line added to ``accumulator``:
        fsynced, then renamed over the output. A second line of a pair is dropped.

        A compressed output is decompressed to a plain temporary beside it first, and sorted
        from that as a plain output is (lines read back by offset, never held), so memory stays
        bounded by the index; the temporary is removed whatever happens.
        """
        if not is_compressed(self.output_path.name):
            self._sort_from(self.output_path, accumulator)
            return
        plain = self.output_path.with_name(self.output_path.name + ".unpacked")
        try:
            _unpack(self.output_path, plain)
            self._sort_from(plain, accumulator)
        finally:
            plain.unlink(missing_ok=True)

    def _sort_from(self, source_path: Path, accumulator: AggregateMetrics) -> None:
        """``_sort_output`` from ``source_path``, the output's plain form."""
        sorted_tmp = self.output_path.with_name(self.output_path.name + ".sorting")
        with open(source_path, "rb") as source:
            index = _index_lines(source, self.output_path)
            index.sort()
            with open(sorted_tmp, "wb") as target:
                out = LineBatches(target, compressed=is_compressed(self.output_path.name))
                previous: tuple[int, int] | None = None
                for task, rollout, offset, length in index:
                    if previous == (task, rollout):
                        log.warning(
                            "%s: dropped a second line of %d-%d", self.output_path, task, rollout
                        )
                        continue
                    previous = (task, rollout)
                    source.seek(offset)
                    line = source.read(length)
                    accumulator.add_line(orjson.loads(line))
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                out.flush()
                target.flush()
                os.fsync(target.fileno())
        os.replace(sorted_tmp, self.output_path)


class _Writer:
    """The only code that writes the output and failures files during a run.

    Lines are appended in batches, one write and one flush per file per batch, in a thread
    (``FrameWriter``: a batch is one complete frame of a compressed output), which also encodes
    the lines that come as JSON objects; the output exists from the start, the failures file
    is created at its first line.
    """

    def __init__(self, output_path: Path, failures_path: Path) -> None:
        self.output = FrameWriter(output_path)
        self.failures = FrameWriter(failures_path)

    async def __aenter__(self) -> _Writer:
        # The end of the run reads the output back, even when no rollout ended well.
        await asyncio.to_thread(self.output.path.touch)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.output.close()
        self.failures.close()

    async def drain(self, queue: asyncio.Queue[tuple[int, Line] | object]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            stop = _STOP in batch
            items = [item for item in batch if isinstance(item, tuple)]
            if items:
                write = loop.run_in_executor(None, self._write, items)
                try:
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    # The thread cannot be stopped; the files must not close under it.
                    await asyncio.wait([write])
                    raise
            if stop:
                return

    def _write(self, items: list[tuple[int, Line]]) -> None:
        for kind, writer in ((_OK, self.output), (_FAILED, self.failures)):
            writer.write(b"".join(_encoded(line) for k, line in items if k == kind))


def http_agent(session: aiohttp.ClientSession, run_url: str) -> AgentCall:
    """The agent at ``run_url`` (its ``/run``), called over ``session``."""

    async def call(body: bytes) -> tuple[int, bytes]:
        async with session.post(
            run_url, data=body, headers={"content-type": "application/json"}
        ) as response:
            return response.status, await response.read()

    return call


async def run_rollout(
    agent: AgentCall,
    rollout: Rollout,
    store: CaptureStore | None,
    io: BatchThread[tuple[Callable[..., Any], tuple[Any, ...]], Any],
    *,
    compactor: CaptureCompactor | None = None,
    encode: bool = True,
) -> RolloutOutcome:
    """Run the rollout through the agent's ``/run`` and build its line: an ``"ok"`` or
    ``"failed"`` outcome.

    The one path from an agent's answer to an output line, for local collection and for a
    cluster's workers alike: ``rollout_line`` with the measured ``/run`` wall-clock, so the
    line has the evidence keys (``ng_model_call_capture`` and ``ng_perf`` with ``store``, the
    capture to attach, read through ``store`` in ``io``; ``ng_trajectory`` whenever there is
    evidence). The line is encoded where it is built (in ``io``, or here when there is nothing
    to read); with ``encode=False`` it is left as the outcome's ``value``, for a writer that
    encodes in a thread of its own. With
    ``compactor``, the rollout's capture is then compacted, failed or not (batched with the
    others finishing, ``CaptureCompactor``); a compaction that fails is a warning only.
    """
    try:
        answer, latency_ms = await _call_agent(agent, rollout)
    except _RolloutFailed as exc:
        failed = failure_line(rollout, exc.kind, str(exc), **exc.detail)
        if compactor is not None:  # its calls stay for `capture show`, compacted all the same
            await compactor.compact(rollout.rollout_id)
        unreachable = exc.model_unreachable
        if not encode:
            return RolloutOutcome(
                RolloutOutcome.FAILED, model_unreachable=unreachable, value=failed
            )
        return RolloutOutcome(
            RolloutOutcome.FAILED, _encoded(failed), model_unreachable=unreachable
        )
    args = (store, rollout, answer, latency_ms)
    build: Callable[..., Line] = _encode_rollout if encode else _rollout_line
    if store is None and not has_evidence(answer):
        line = build(*args)  # nothing to read or build: no thread needed
    else:
        line = await io.submit((build, args))
    if compactor is not None:
        await compactor.compact(rollout.rollout_id)
    if isinstance(line, bytes):
        return RolloutOutcome(RolloutOutcome.OK, line)
    return RolloutOutcome(RolloutOutcome.OK, value=line)


async def _call_agent(agent: AgentCall, rollout: Rollout) -> tuple[dict[str, Any], float]:
    """The agent's checked answer, and the wall-clock of its ``/run`` in milliseconds: from
    the request's start until its answer was read and parsed."""
    body = orjson.dumps(rollout.run_body())
    started = time.perf_counter()
    try:
        status, raw = await agent(body)
    except TimeoutError:
        raise _RolloutFailed("timeout", "the agent did not answer in time") from None
    except aiohttp.ClientError as exc:
        raise _RolloutFailed("connection", f"{type(exc).__name__}: {exc}") from None
    if not 200 <= status < 300:
        error_body = _body(raw)
        raise _RolloutFailed(
            "agent_error",
            f"the agent answered HTTP {status}",
            model_unreachable=_model_unreachable(status, error_body),
            status=status,
            body=error_body,
        )
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _RolloutFailed(
            "bad_json", f"the agent's answer is not JSON ({exc})", body=_body(raw)
        ) from None
    latency_ms = (time.perf_counter() - started) * 1000
    try:
        return check_agent_answer(answer), latency_ms
    except AgentAnswerError as exc:
        raise _RolloutFailed("bad_answer", str(exc)) from None


def _model_unreachable(status: int, body: Any) -> bool:
    """An agent's error that says its model server gave no answer at all (no ``status``)."""
    error = body.get("error") if isinstance(body, dict) else None
    return (
        status in _MODEL_UNREACHABLE_STATUSES
        and isinstance(error, dict)
        and error.get("server") == "model"
        and "status" not in error
    )


def _start_capture(store: CaptureStore, rollout_id: str) -> None:
    """Clear the rollout-attempt's capture, and leave its empty file as the attempt's mark.

    The journal says this attempt was dispatched; the empty file says so to a resumed run
    that has no journal (see ``_plan``); to readers it is a rollout with no calls yet.
    """
    store.reset(rollout_id)


def _rollout_line(
    store: CaptureStore | None,
    rollout: Rollout,
    answer: Mapping[str, Any],
    latency_ms: float,
) -> dict[str, Any]:
    # The collector's own store: the capture is read through it as it is, no store made anew.
    return rollout_line(
        rollout,
        answer,
        capture_dirs=() if store is None else (store,),
        observability_enabled=store is not None,
        rollout_latency_ms=latency_ms,
    )


def _encode_rollout(
    store: CaptureStore | None,
    rollout: Rollout,
    answer: Mapping[str, Any],
    latency_ms: float,
) -> bytes:
    return _encoded(_rollout_line(store, rollout, answer, latency_ms))


def _encoded(line: Line) -> bytes:
    """A line as the output and failures files hold it: its JSON, newline included."""
    if isinstance(line, bytes):
        return line
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def _body(raw: bytes) -> Any:
    """An error body for the failures file: its JSON when it is JSON, else its text, cut short."""
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(raw)
    return raw[: _ERROR_BODY_LIMIT * 4].decode("utf-8", "replace")[:_ERROR_BODY_LIMIT]


def _lines_of(stack: contextlib.ExitStack, path: Path) -> Iterator[bytes]:
    """The file's lines (``iter_lines``: plain or compressed), open until ``stack`` closes; a
    missing file has none."""
    try:
        return stack.enter_context(iter_lines(path))
    except FileNotFoundError:
        return iter(())


def _cut_torn_end(path: Path) -> None:
    """Make the output end where an append can start: a plain one's torn last line is cut, a
    compressed one's last frame cut short (``_cut_torn_frame``)."""
    if is_compressed(path.name):
        _cut_torn_frame(path)
    else:
        _cut_torn_tail(path)


def _cut_torn_frame(path: Path) -> None:
    """Cut a last frame a killed run left half-written, so that appends start a whole frame.

    A frame that does not decode raises ``CompressedFileError`` (naming the file and its
    byte) with the file untouched: frames appended behind it would hold lines no strict read
    of the file reaches.
    """
    try:
        keep = whole_frames_length(path)
    except FileNotFoundError:
        return
    size = os.path.getsize(path)
    if keep < size:
        os.truncate(path, keep)
        log.warning(
            "%s: cut a last frame cut short (%d bytes from byte %d)", path, size - keep, keep
        )


def _unpack(packed: Path, plain: Path) -> None:
    """Write the compressed file's plain form to ``plain``, one frame's lines held at a time;
    a frame's last line without its newline is ended, so that it stays a line of its own."""
    with iter_lines(packed) as lines, open(plain, "wb") as out:
        for line in lines:
            out.write(line if line.endswith(b"\n") else line + b"\n")


def _cut_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a run killed mid-write); appends then start clean."""
    try:
        handle = open(path, "r+b")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        return
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        # Walk back to the last newline in blocks: the torn line may be long.
        end = keep = size
        while end > 0:
            start = max(0, end - (1 << 16))
            handle.seek(start)
            cut = handle.read(end - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        else:
            keep = 0
        handle.truncate(keep)
        log.warning("%s: cut a torn last line (%d bytes)", path, size - keep)


def _index_lines(source: IO[bytes], path: Path) -> list[tuple[int, int, int, int]]:
    """``(task, rollout, offset, length)`` of each rollout line; other lines are dropped."""
    index: list[tuple[int, int, int, int]] = []
    offset = 0
    for line in source:
        length = len(line)
        # The resume planner's reading of a line: what it takes for a rollout, sorting does too.
        ids = rollout_line_ids(line)
        if ids is not None:
            index.append((ids[0], ids[1], offset, length))
        elif line.strip():
            log.warning("%s: dropped a line at byte %d that is not a rollout line", path, offset)
        offset += length
    return index
