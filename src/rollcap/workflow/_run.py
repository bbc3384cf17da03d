"""``rollcap eval run``: collect rollouts against an environment, then report.

With ``--no-serve`` the agent is found through a running head server (``rollcap env start``);
without it the environment is started here, around the collection, and stopped after. With
``--ray`` (``EvalRequest.ray``) the rollouts run on a Ray cluster's nodes instead
(``rollcap.cluster``), this process keeping planning, resume and the output files. With
``--wandb-project`` the finished run is logged to W&B (``_wandb``), once collection is over.

Two configuration keys shape what each rollout asks of the model (``request_params``): a
``responses_create_params`` mapping merged over every task's own, and ``rollout_seed``, which
gives rollout ``r`` of every task ``seed: rollout_seed + r`` (``rollcap.collect.RequestParams``):
``++responses_create_params.temperature=0.7 ++rollout_seed=0`` with ``--num-repeats 4`` samples
four different, reproducible rollouts per task.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import orjson
import rich.console
import rich.progress

from rollcap.cluster._settings import ClusterSettings
from rollcap.collect import PARAMS_KEY, CollectionSummary, Dispatch, RequestParams, collect
from rollcap.config import ConfigError, RunSettings
from rollcap.status import ModelServers, StatusOptions
from rollcap.workflow._discovery import find_server, head_url, list_servers
from rollcap.workflow._wandb import log_to_wandb, require_wandb

__all__ = ["EvalRequest", "Progress", "format_summary", "request_params", "run_eval"]


@dataclass(frozen=True, slots=True)
class EvalRequest:
    agent: str
    input_path: Path
    output_path: Path
    limit: int | None = None
    num_repeats: int = 1
    concurrency: int = 16
    resume: bool = False
    serve: bool = True
    model_type: str | None = None
    head_url: str | None = None
    head_port: int = 11000
    wandb_project: str | None = None
    wandb_entity: str | None = None
    ray: ClusterSettings | None = None  # run on a Ray cluster


class Progress:
    """Collection progress: a rich bar with rate, ETA and the stalled and slow rollouts on a
    terminal; in logs, a line every 10% and one whenever the number stalled changes.

    Call it as the collector's progress callback, ``live`` with each status document; ``close()``
    when the run is over.
    """

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self._last_decile = -1
        self._bar: rich.progress.Progress | None = None
        self._task: rich.progress.TaskID | None = None
        self.stalled = 0
        self.slow = 0
        self._tty = stream.isatty()
        if self._tty:
            self._bar = rich.progress.Progress(
                rich.progress.TextColumn("rollouts"),
                rich.progress.BarColumn(),
                rich.progress.MofNCompleteColumn(),
                rich.progress.TextColumn("{task.fields[failed]} failed"),
                rich.progress.TextColumn("{task.fields[stalled]} stalled"),
                rich.progress.TextColumn("{task.fields[slow]} slow"),
                rich.progress.TextColumn("{task.fields[rate]}/s"),
                rich.progress.TextColumn("ETA"),
                rich.progress.TimeRemainingColumn(),
                console=rich.console.Console(file=stream),
            )

    def __call__(self, done: int, failed: int, total: int) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed
        if self._bar is not None:
            if self._task is None:
                self._bar.start()
                self._task = self._bar.add_task(
                    "collect", total=total, failed=0, stalled=0, slow=0, rate="0.0"
                )
            self._bar.update(
                self._task,
                completed=done,
                total=total,
                failed=failed,
                stalled=self.stalled,
                slow=self.slow,
                rate=f"{rate:.1f}",
            )
            if done >= total:
                self.close()
            return
        decile = 10 * done // total if total else 10
        if decile != self._last_decile or done >= total:
            self._last_decile = decile
            eta = f"{(total - done) / rate:.0f}s" if rate > 0 else "?"
            print(
                f"{done}/{total} rollouts, {failed} failed, {self.stalled} stalled, "
                f"{self.slow} slow, {rate:.1f}/s, ETA {eta}",
                file=self.stream,
                flush=True,
            )

    def live(self, document: Mapping[str, Any]) -> None:
        """A status document (``rollcap.status``): its stalled and slow counts."""
        states = document.get("states") or {}
        stalled, slow = int(states.get("stalled", 0)), int(states.get("slow", 0))
        changed = stalled != self.stalled
        self.stalled, self.slow = stalled, slow
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, stalled=stalled, slow=slow)
        elif not self._tty and changed and not document.get("run", {}).get("finished"):
            listed = [r for r in document.get("rollouts", ()) if r.get("state") == "stalled"]
            names = ", ".join(str(r.get("rollout_id")) for r in listed[:5])
            more = "" if len(listed) <= 5 else f" and {stalled - 5} more"
            print(
                f"{stalled} rollout(s) stalled" + (f": {names}{more}" if names else ""),
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _uncorrelated(model_url: str | None) -> int | None:
    if model_url is None:
        return None
    try:
        with urllib.request.urlopen(f"{model_url}/health", timeout=10) as response:
            value = orjson.loads(response.read()).get("uncorrelated")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) else None


def request_params(config: Mapping[str, Any]) -> RequestParams:
    """The run's ``responses_create_params`` (a mapping, default none) and ``rollout_seed`` (an
    integer >= 0, default none) keys; a bad value is a ``ConfigError`` naming the key."""
    overrides = config.get(PARAMS_KEY)
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"{PARAMS_KEY} must be a mapping of Responses parameters "
            f"(++{PARAMS_KEY}.temperature=0.7), got {overrides!r}"
        )
    try:
        return RequestParams(overrides, config.get("rollout_seed"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _resources_of(agent: str, config: Mapping[str, Any]) -> str | None:
    """The resources server a built-in agent brings (a configured agent names its own)."""
    from rollcap.gym import AGENTS
    from rollcap.workflow._env import instances

    if agent in {i.name for i in instances(config)}:
        return None
    if agent not in AGENTS:
        raise ConfigError(
            f"unknown agent {agent!r}: expected one of {', '.join(AGENTS)} or a configured agent"
        )
    return AGENTS[agent].resources_server


@dataclass(frozen=True, slots=True)
class _Servers:
    """Where a run's agent, model servers and head server are."""

    agent_url: str
    models: list[tuple[str, str]]  # (name, URL)
    head_url: str

    @property
    def model_url(self) -> str | None:
        return self.models[0][1] if self.models else None


@contextlib.asynccontextmanager
async def _agent_and_model(
    request: EvalRequest, config: Mapping[str, Any]
) -> AsyncIterator[_Servers]:
    """The agent's, model servers' and head server's URLs, from a head server or a fresh
    environment."""
    if not request.serve:
        servers = list_servers(request.head_url)
        agent = str(find_server(servers, request.agent, "responses_api_agents")["url"])
        models = [
            (str(s["name"]), str(s["url"]))
            for s in servers
            if s.get("kind") == "responses_api_models"
        ]
        yield _Servers(agent, models, request.head_url or head_url())
        return
    from rollcap.workflow._env import environment

    resources = _resources_of(request.agent, config)
    async with environment(
        config,
        model_type=request.model_type,
        resources_server=resources,
        agent=request.agent,
        head_port=request.head_port,
    ) as env:
        models = [(s.name, s.url) for s in env.servers if s.kind == "responses_api_models"]
        yield _Servers(env.url_of(request.agent), models, env.head_url)


async def run_eval(
    request: EvalRequest,
    config: Mapping[str, Any],
    *,
    progress: Progress | None = None,
    on_started: Callable[[], None] | None = None,
) -> tuple[CollectionSummary, int | None]:
    """Collect; returns the summary and the model server's count of uncorrelated calls.

    ``on_started`` is called once the servers (if any) are up, before the first rollout.
    """
    settings = RunSettings.from_config(config)
    params = request_params(config)
    if not request.input_path.is_file():
        raise ConfigError(f"--input {request.input_path}: no such file")
    if request.wandb_project is not None:
        require_wandb()  # before anything runs: a missing client is a one-line error
    if request.ray is not None:
        summary, uncorrelated = await _run_on_cluster(
            request, request.ray, config, settings, params, progress, on_started
        )
    else:
        summary, uncorrelated = await _run_here(
            request, config, settings, params, progress, on_started
        )
    if request.wandb_project is not None:
        await _log_to_wandb(request, summary, capture=settings.capture_dir is not None)
    return summary, uncorrelated


async def _run_here(
    request: EvalRequest,
    config: Mapping[str, Any],
    settings: RunSettings,
    params: RequestParams,
    progress: Progress | None,
    on_started: Callable[[], None] | None,
) -> tuple[CollectionSummary, int | None]:
    async with _agent_and_model(request, config) as servers:
        if on_started is not None:
            on_started()
        status = _status(settings, progress, servers.models, servers.head_url)
        summary = await _collect(
            request, settings, params, progress, servers.agent_url, status=status
        )
        # In a thread: the model server may be served by this very event loop.
        uncorrelated = await asyncio.to_thread(_uncorrelated, servers.model_url)
    return summary, uncorrelated


def _status(
    settings: RunSettings,
    progress: Progress | None,
    models: ModelServers,
    head: str | None,
) -> StatusOptions:
    sinks = [] if progress is None else [progress.live]
    return StatusOptions(settings.live_status, models, head, sinks)


async def _collect(
    request: EvalRequest,
    settings: RunSettings,
    params: RequestParams,
    progress: Progress | None,
    agent_url: str | None,
    *,
    dispatch: Dispatch | None = None,
    lost_retries: int = 1,
    status: StatusOptions | None = None,
) -> CollectionSummary:
    """Collect ``request``'s rollouts from ``agent_url``, or through a cluster's ``dispatch``."""
    return await collect(
        agent_url,
        request.input_path,
        request.output_path,
        capture_dir=settings.capture_dir,
        limit=request.limit,
        num_repeats=request.num_repeats,
        concurrency=request.concurrency,
        resume=request.resume,
        progress=progress,
        agent_name=request.agent,
        dispatch=dispatch,
        lost_retries=lost_retries,
        request_params=params,
        status=status,
        compress_capture_level=settings.compress_capture_level,
    )


async def _log_to_wandb(request: EvalRequest, summary: CollectionSummary, *, capture: bool) -> None:
    """Log the finished run to W&B, in a thread; a failure is reported, never raised: the
    rollouts are written already."""
    assert request.wandb_project is not None
    config = {
        "agent": request.agent,
        "input": str(request.input_path),
        "output": str(request.output_path),
        "limit": request.limit,
        "num_repeats": request.num_repeats,
        "concurrency": request.concurrency,
        "capture": capture,
    }
    try:
        directory = await asyncio.to_thread(
            log_to_wandb,
            summary.output_path,
            summary.aggregate_metrics,
            project=request.wandb_project,
            entity=request.wandb_entity,
            config=config,
        )
    except Exception as exc:
        print(f"W&B: not logged: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    else:
        print(f"W&B: logged to project {request.wandb_project} ({directory})", file=sys.stderr)


async def _run_on_cluster(
    request: EvalRequest,
    cluster: ClusterSettings,
    config: Mapping[str, Any],
    settings: RunSettings,
    params: RequestParams,
    progress: Progress | None,
    on_started: Callable[[], None] | None,
) -> tuple[CollectionSummary, int | None]:
    from rollcap.cluster import cluster_collection

    resources = _resources_of(request.agent, config) if request.serve else None
    async with cluster_collection(
        config,
        cluster,
        agent=request.agent,
        capture_dir=settings.capture_dir,
        compress_capture_level=settings.compress_capture_level,
        serve=request.serve,
        model_type=request.model_type,
        resources_server=resources,
        head_url=request.head_url,
    ) as run:
        if on_started is not None:
            on_started()
        replicas, model_url = run.replicas, run.model_url

        def models() -> list[tuple[str, str]]:
            if replicas is not None:
                return [(f"policy_model@{r['node_id']}", r["url"]) for r in replicas.listing()]
            return [] if model_url is None else [("policy_model", model_url)]

        head = None if request.serve else (request.head_url or head_url())
        summary = await _collect(
            request,
            settings,
            params,
            progress,
            None,
            dispatch=run.dispatch,
            lost_retries=cluster.lost_retries,
            status=_status(settings, progress, models, head),
        )
        if run.replicas is not None:
            return summary, await run.uncorrelated()
        return summary, await asyncio.to_thread(_uncorrelated, run.model_url)


def format_summary(summary: CollectionSummary, uncorrelated: int | None) -> str:
    m = summary.metrics

    def n(key: str) -> str:
        value = m.get(key)
        return (
            "-" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))
        )

    lines = [
        f"rollouts {m.get('rollouts')} (this run {summary.ran}, failed {summary.failed}, "
        f"skipped {summary.skipped}); mean reward {n('mean_reward')}",
        f"model calls {n('num_calls')}; tokens in {n('tokens_in')}, out {n('tokens_out')}, "
        f"reasoning {n('tokens_reasoning')}, cached {n('cached_tokens')}",
        f"model latency per rollout ms: p50 {n('latency_p50_ms')}, p90 {n('latency_p90_ms')}, "
        f"p99 {n('latency_p99_ms')}",
    ]
    perf = summary.perf_summary
    if perf is not None:

        def p(key: str) -> str:
            value = perf.get(key)
            return "-" if value is None else f"{value:.2f}"

        lines.append(
            f"agent evidence: coverage {p('overall_observability_coverage')}, turns per rollout "
            f"mean {p('mean_num_turns')} (max {p('max_num_turns')}), run ms p50 "
            f"{p('total_latency_p50_ms')}, p90 {p('total_latency_p90_ms')}"
        )
    lines += [
        f"output   {summary.output_path}",
        f"failures {summary.failures_path}",
        f"metrics  {summary.metrics_path}",
    ]
    if summary.lost:
        lines.append(
            f"LOST: {summary.lost} rollout(s) died with their node, worker or model server and "
            "were written nowhere; run again with --resume to collect them"
        )
    missing = summary.rollouts_without_calls
    if missing:
        lines.append(
            f"WARNING: {missing} rollout(s) have no captured model call. The model server counted "
            f"{'?' if uncorrelated is None else uncorrelated} call(s) without the /ng-rollout/ "
            "prefix: does the agent route its model calls with url_path_for_run?"
        )
    return "\n".join(lines)
