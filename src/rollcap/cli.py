"""The ``rollcap`` command (also installed as ``gym``): parse, call, map errors to exit codes.

Exit codes: 0 success, 1 a runtime failure (unreadable files and the like), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import orjson

from rollcap import __version__
from rollcap._runtime.heap import freeze_startup
from rollcap.attachment import capture_attachment
from rollcap.config import ConfigError, RunSettings, load_config
from rollcap.report._otel_cli import add_export_otel_command, run_export_otel
from rollcap.store import DEFAULT_LEVEL, CaptureReadError, CaptureStore, check_level

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _level(text: str) -> int:
    try:
        return check_level(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _overrides_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="key=value, +key=value or ++key=value"
    )


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", action="append", default=[], metavar="FILE", help="YAML config (repeatable)"
    )
    _overrides_argument(parser)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollcap", description="Model-call capture for LLM agent evaluation and RL training."
    )
    parser.add_argument("--version", action="version", version=f"rollcap {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run one server on its own")
    serve_commands = serve.add_subparsers(dest="serve_command", required=True)
    model = serve_commands.add_parser(
        "model", help="a capturing model server (name policy_model) in front of an upstream"
    )
    model.add_argument("--model-type", required=True, help="openai_model, anthropic_model, ...")
    model.add_argument("--host", default="127.0.0.1")
    model.add_argument("--port", type=int, default=8000)
    _config_arguments(model)
    worker = serve_commands.add_parser(
        "worker",
        help="the token-capture worker in front of a vLLM-compatible chat endpoint (RL staging)",
    )
    worker.add_argument(
        "--upstream", required=True, metavar="URL", help="e.g. http://127.0.0.1:8000/v1"
    )
    worker.add_argument(
        "--staging-dir", required=True, type=Path, metavar="DIR", help="absolute; created if absent"
    )
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--port", type=int, default=8100)
    worker.add_argument(
        "--weight-version",
        type=int,
        default=0,
        metavar="N",
        help="stamped on every staged call (default 0)",
    )
    worker.add_argument(
        "--prefix-cache-ids",
        type=int,
        default=16_000_000,
        metavar="N",
        help="ids kept in memory for continuations' prefixes, 8 bytes each (default 16M; 0: none)",
    )
    worker.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the upstream's API key (sent as a Bearer token)",
    )

    env = commands.add_parser("env", help="run an evaluation environment")
    env_commands = env.add_subparsers(dest="env_command", required=True)
    start = env_commands.add_parser(
        "start", help="model, resources and agent servers and a head server, until interrupted"
    )
    start.add_argument("--resources-server", required=True, help="e.g. mcqa")
    start.add_argument("--model-type", required=True, help="openai_model, vllm_model, ...")
    start.add_argument("--agent", help="default: the built-in agent of the resources server")
    start.add_argument("--host", default="127.0.0.1")
    start.add_argument("--head-port", type=int, default=11000)
    _ray_arguments(start)
    _config_arguments(start)

    evaluation = commands.add_parser("eval", help="collect rollouts")
    eval_commands = evaluation.add_subparsers(dest="eval_command", required=True)
    run = eval_commands.add_parser("run", help="run every task of an input file through an agent")
    run.add_argument("--agent", required=True, help="e.g. mcqa_simple_agent")
    run.add_argument("--input", required=True, type=Path, help="tasks, one JSON object a line")
    run.add_argument("--output", required=True, type=Path, help="rollouts, one JSON object a line")
    run.add_argument("--limit", type=_positive, help="only the first N tasks")
    run.add_argument("--num-repeats", type=_positive, default=1, help="rollouts per task")
    run.add_argument("--concurrency", type=_positive, default=16, help="rollouts at once")
    run.add_argument("--resume", action="store_true", help="skip finished rollouts, retry others")
    run.add_argument(
        "--no-serve", action="store_true", help="use servers started by `rollcap env start`"
    )
    run.add_argument("--model-type", help="without --no-serve: the model server to start")
    run.add_argument(
        "--head-url", help="with --no-serve: the head server (default 127.0.0.1:11000)"
    )
    run.add_argument("--head-port", type=int, default=11000, help="without --no-serve")
    run.add_argument(
        "--wandb-project",
        metavar="P",
        help="log the rollouts and metrics to this W&B project at the end (rollcap[wandb])",
    )
    run.add_argument("--wandb-entity", metavar="E", help="the W&B entity (team or user)")
    run.add_argument(
        "--compress-capture",
        action="store_true",
        help="compact each rollout's capture into .capture.jsonl.zst once its line is built",
    )
    _ray_arguments(run)
    _config_arguments(run)

    submit = eval_commands.add_parser(
        "submit", help="run every benchmark of a driver config into its job directory"
    )
    submit.add_argument("-c", "--config", required=True, type=Path, metavar="DRIVER_YAML")
    _overrides_argument(submit)

    capture = commands.add_parser("capture", help="inspect a model-call capture directory")
    capture_commands = capture.add_subparsers(dest="capture_command", required=True)
    listing = capture_commands.add_parser("list", help="one line per rollout: calls and tokens")
    listing.add_argument("directory", help="the capture directory (model_call_capture_dir)")
    show = capture_commands.add_parser(
        "show", help="print a rollout's ng_model_call_capture attachment as JSON"
    )
    show.add_argument("directory", help="the capture directory (model_call_capture_dir)")
    show.add_argument("rollout_id")
    show.add_argument(
        "--no-payloads", action="store_true", help="omit request and response payloads"
    )
    attach = capture_commands.add_parser(
        "attach",
        help="rebuild the evidence keys of a rollouts file from a capture directory",
    )
    attach.add_argument("rollouts", type=Path, metavar="ROLLOUTS.jsonl")
    attach.add_argument(
        "--capture-dir",
        required=True,
        action="append",
        type=Path,
        metavar="DIR",
        help="the capture directory (repeatable: the first that has a rollout wins)",
    )
    attach.add_argument(
        "-o", "--output", type=Path, metavar="OUT", help="default: rewrite ROLLOUTS in place"
    )
    compress = capture_commands.add_parser(
        "compress",
        help="compact every plain capture file into .capture.jsonl.zst (verified, atomic)",
    )
    compress.add_argument("directory", help="the capture directory (model_call_capture_dir)")
    compress.add_argument(
        "--level",
        type=_level,
        default=DEFAULT_LEVEL,
        help=f"the Zstandard level, 1 to 22 (default {DEFAULT_LEVEL})",
    )
    decompress = capture_commands.add_parser(
        "decompress", help="expand every .capture.jsonl.zst back into its plain file"
    )
    decompress.add_argument("directory", help="the capture directory (model_call_capture_dir)")
    add_export_otel_command(capture_commands)
    report = capture_commands.add_parser(
        "report", help="write one self-contained HTML file that shows the run (opens offline)"
    )
    _run_arguments(report)
    report.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), help="default: report.html"
    )
    report.add_argument(
        "--payload-budget",
        type=_size,
        default=None,
        metavar="SIZE",
        help="most bytes of payloads to embed, e.g. 16MiB (default 64MiB); "
        "the rest is left to `rollcap capture view`",
    )
    status = commands.add_parser(
        "status",
        help="a running collection's rollouts, stalled ones first, live until the run ends",
    )
    _status_source_arguments(status, "the status to show (default: the head server at "
                             "$ROLLCAP_HEAD_URL or http://127.0.0.1:11000)")  # fmt: skip
    status.add_argument("--once", action="store_true", help="print the table once and exit")
    status.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between redraws"
    )
    report.add_argument(
        "--compare",
        metavar="B",
        help="compare this run (A) with run B: the summary, the tasks by change, each task's "
        "rollouts side by side (B: as `rollcap compare` takes it)",
    )
    _compare_arguments(report)
    _compare_command(commands)
    view = capture_commands.add_parser(
        "view", help="serve the same page live (new rollouts appear) until Ctrl-C"
    )
    _run_arguments(view)
    view.add_argument("--host", default="127.0.0.1")
    view.add_argument("--port", type=int, default=0, help="default: any free port")
    _status_source_arguments(
        view,
        "the live panel's run status (default: the status file beside --rollouts, if any)",
    )
    return parser


def _margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _resamples(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000_000:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 10000000, got {text!r}")
    return int(text)


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    """``--key`` and ``--cluster``: how tasks are matched and grouped (also the report's)."""
    parser.add_argument(
        "--key",
        metavar="FIELD",
        help="the line field (dotted: a.b) that names a task in both runs "
        "(default: responses_create_params.input, the task's input)",
    )
    parser.add_argument(
        "--cluster",
        metavar="FIELD",
        help="the line field whose value groups tasks that share a context: "
        "cluster-robust standard errors",
    )


def _compare_command(commands: Any) -> None:
    parser = commands.add_parser(
        "compare",
        help="compare two runs task by task: what got better, what got worse, whether it is real",
    )
    for name in ("a", "b"):
        parser.add_argument(
            name,
            metavar=name.upper(),
            help="an output file, a job directory, a capture directory or eval submit's job_dir",
        )
    _compare_arguments(parser)
    parser.add_argument(
        "--fail-if-worse",
        type=_margin,
        metavar="D",
        help="exit 1 when the 95%% interval's upper bound of B - A (mean reward) is below -D",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    parser.add_argument(
        "--resamples", type=_resamples, default=None, help="the bootstrap's resamples (10000)"
    )


def _compare(args: argparse.Namespace) -> int:
    # Here: the comparison loads the evidence models, which the CLI does not load to start.
    from rollcap.compare import DEFAULT_RESAMPLES, compare_runs

    comparison = compare_runs(
        args.a,
        args.b,
        key=args.key,
        cluster=args.cluster,
        fail_if_worse=args.fail_if_worse,
        seed=args.seed,
        resamples=args.resamples or DEFAULT_RESAMPLES,
    )
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(comparison.data, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(comparison.text())
    # 1, as a runtime failure: a CI step that gates on it fails the same way.
    return EXIT_FAILURE if comparison.failed else EXIT_OK


def _status_source_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--head-url", metavar="URL", help=f"{what}: from this head server's GET /status"
    )
    where.add_argument(
        "--status-file", type=Path, metavar="F", help=f"{what}: from a run's <output>_status.json"
    )


def _ray_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run on a Ray cluster (default: the one Ray finds from this host); needs "
        "rollcap[ray]. Config: the ray section (docs/scale-out.md)",
    )
    parser.add_argument(
        "--replicas", type=_positive, metavar="N", help="with --ray: model-server replicas"
    )


def _cluster_settings(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    """The ``ClusterSettings`` of ``--ray`` and the ``ray`` config section, or None."""
    from rollcap.cluster import ClusterSettings

    overrides: dict[str, Any] = {"replicas": args.replicas}
    if args.ray is not None:
        overrides.update(enabled=True, address=args.ray or None)
    cluster = ClusterSettings.from_config(config, **overrides)
    if not cluster.enabled:
        if args.replicas is not None:
            raise ConfigError("--replicas runs replicas on a Ray cluster: add --ray")
        return None
    from rollcap.cluster import require_ray

    require_ray()  # without the extra: one line naming the install, before anything starts
    return cluster


def _check_capture(settings: RunSettings) -> None:
    """The capture directory's start-up check (the lock probe) on one host; warnings logged."""
    if settings.capture_dir is None:
        return
    from rollcap.store import check_capture_dir

    for warning in check_capture_dir(settings.capture_dir):
        logging.getLogger("rollcap").warning("%s", warning)


def _size(text: str) -> int:
    from rollcap.report import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="a capture directory, or an `eval submit` job directory")
    parser.add_argument(
        "--rollouts", type=Path, metavar="R.jsonl", help="the rollouts file (rewards, failures)"
    )
    parser.add_argument(
        "--staging", type=Path, metavar="DIR", help="the RL staging directory (token view)"
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        metavar="DIR",
        help="the staging gate's ledger directory (token_id_capture.dir; default: DIR itself)",
    )


def _capture_dir(directory: str) -> Path:
    """An existing capture directory; ``FileNotFoundError`` (exit 1) otherwise, so that a
    mistyped path is never read as a capture without rollouts."""
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"{directory}: no such capture directory")
    return path


def _capture_store(directory: str) -> CaptureStore:
    """The capture store of an existing directory (``_capture_dir``)."""
    return CaptureStore(_capture_dir(directory))


def _existing_file(path: Path | str | None, what: str) -> None:
    """A file a command reads, there before the command starts (``FileNotFoundError``)."""
    if path is not None and not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such {what}")


def _capture_list(directory: str) -> int:
    store = _capture_store(directory)
    ids = store.rollout_ids()
    if not ids:
        print(f"no capture files in {directory}", file=sys.stderr)
        return EXIT_OK
    print(f"{'rollout_id':<32}{'calls':>7}{'tokens_in':>11}{'tokens_out':>11}  gaps")
    for rollout_id in ids:
        attachment = capture_attachment(store, rollout_id, payloads=False)
        metrics = attachment["metrics"]
        gaps = ",".join(
            g["code"].removeprefix("model_call_capture_") for g in attachment.get("gaps", [])
        )

        def _n(value: object) -> str:
            return "-" if value is None else str(value)

        print(
            f"{rollout_id:<32}{metrics['num_calls']:>7}{_n(metrics['tokens_in']):>11}"
            f"{_n(metrics['tokens_out']):>11}  {gaps}"
        )
    return EXIT_OK


def _capture_show(directory: str, rollout_id: str, payloads: bool) -> int:
    store = _capture_store(directory)
    if not store.has_capture(rollout_id):
        raise FileNotFoundError(
            f"{directory}: no capture of rollout {rollout_id!r} (`capture list` names them)"
        )
    attachment = capture_attachment(store, rollout_id, payloads=payloads)
    sys.stdout.buffer.write(orjson.dumps(attachment, option=orjson.OPT_INDENT_2) + b"\n")
    return EXIT_OK


def _capture_attach(args: argparse.Namespace) -> int:
    from rollcap.collect import reattach

    summary = reattach(args.rollouts, args.capture_dir, args.output)
    copied = []
    if summary.without_rollout:
        copied.append(f"{summary.without_rollout} naming no rollout")
    if summary.not_objects:
        copied.append(f"{summary.not_objects} not JSON objects")
    kept = f"; copied as they were: {', '.join(copied)}" if copied else ""
    print(f"attached the evidence of {summary.attached} rollouts to {summary.output_path}{kept}")
    return EXIT_OK


def _capture_recompress(args: argparse.Namespace) -> int:
    """``capture compress`` and ``capture decompress``, of the capture files and the token
    ledger's beside them: one line of what was done, one line a rollout that could not be
    (left as it was; exit 1)."""
    from rollcap.staging import LINEAGE_MARKER_SUFFIX, LINEAGE_SUFFIX
    from rollcap.store import DirectoryPass, compress_directory, decompress_directory

    directory = _capture_dir(args.directory)
    done = DirectoryPass()
    for kind in ({}, {"suffix": LINEAGE_SUFFIX, "marker_suffix": LINEAGE_MARKER_SUFFIX}):
        if args.capture_command == "compress":
            this = compress_directory(directory, level=args.level, **kind)
        else:
            this = decompress_directory(directory, **kind)
        done.add(this)
    verb = "compacted" if args.capture_command == "compress" else "expanded"
    for rollout_id, reason in done.failed:
        print(f"rollout {rollout_id}: left as it was: {reason}", file=sys.stderr)
    sizes = f" ({done.bytes_before} bytes -> {done.bytes_after})" if done.changed else ""
    print(f"{verb} {done.changed} files{sizes}; {done.unchanged} had nothing to do")
    return EXIT_FAILURE if done.failed else EXIT_OK


def _capture_export_otel(args: argparse.Namespace) -> int:
    # Checked here, ahead of the exporter (and of the check for its extra), so that a missing
    # input reads as it does for every other capture command.
    _capture_dir(args.directory)
    _existing_file(args.rollouts, "rollouts file")
    return run_export_otel(args)


def _capture_compare_report(args: argparse.Namespace) -> int:
    from rollcap.compare import compare_runs, write_compare_report
    from rollcap.report import DEFAULT_PAYLOAD_BUDGET

    for option in ("rollouts", "staging", "ledger"):
        if getattr(args, option) is not None:
            raise ValueError(
                f"--{option} is not taken with --compare: each run is found by its path"
            )
    if not args.output.parent.is_dir():
        raise FileNotFoundError(f"{args.output.parent}: no such directory for the report (-o)")
    comparison = compare_runs(args.directory, args.compare, key=args.key, cluster=args.cluster)
    budget = DEFAULT_PAYLOAD_BUDGET if args.payload_budget is None else args.payload_budget
    stats = write_compare_report(comparison, args.output, payload_budget=budget)
    matched = comparison.data["overall"]["tasks"]["matched"]
    print(
        f"wrote {args.output} ({stats.size / 1e6:.2f} MB): {matched} tasks matched, "
        f"A {args.directory} against B {args.compare}"
    )
    if stats.payloads_left_out:
        print(f"over the payload budget: the payloads of {stats.payloads_left_out} rollouts")
    return EXIT_OK


def _capture_report(args: argparse.Namespace) -> int:
    from rollcap.report import DEFAULT_PAYLOAD_BUDGET, find_run, write_report

    if args.compare is not None:
        return _capture_compare_report(args)
    if args.key is not None or args.cluster is not None:
        raise ValueError("--key and --cluster are taken with --compare only")
    run = find_run(args.directory, rollouts=args.rollouts, staging=args.staging, ledger=args.ledger)
    if not args.output.parent.is_dir():
        # Said before the page is built; writing would name its temporary file instead.
        raise FileNotFoundError(f"{args.output.parent}: no such directory for the report (-o)")
    if run.rollouts_note is not None:
        print(run.rollouts_note)
    budget = DEFAULT_PAYLOAD_BUDGET if args.payload_budget is None else args.payload_budget
    stats = write_report(run, args.output, payload_budget=budget)
    print(
        f"wrote {args.output} ({stats.size / 1e6:.2f} MB): {stats.rollouts} rollouts, "
        f"{stats.calls} calls from {run.capture_dir}"
    )
    left = stats.payloads_left_out + stats.raw_left_out
    if left:
        print(
            f"over the payload budget, left to `rollcap capture view`: the payloads of "
            f"{stats.payloads_left_out} rollouts, the raw texts of {stats.raw_left_out}"
        )
    return EXIT_OK


def _capture_view(args: argparse.Namespace) -> int:
    from rollcap._runtime.serving import bind, serving
    from rollcap.report import create_view_app, find_run
    from rollcap.status import StatusSource, status_path

    run = find_run(args.directory, rollouts=args.rollouts, staging=args.staging, ledger=args.ledger)
    beside = None if args.rollouts is None else StatusSource(path=status_path(args.rollouts))
    app = create_view_app(run, host=args.host, live=_status_source(args, beside))
    sock = bind(args.host, args.port)

    async def serve() -> None:
        async with serving(app, sock=sock) as url:
            print(f"rollcap capture view of {run.capture_dir} on {url}/ (Ctrl-C stops)", flush=True)
            if run.rollouts_note is not None:
                print(run.rollouts_note, flush=True)
            await asyncio.Event().wait()

    _run_until_interrupted(serve())
    return EXIT_OK


def _status_source(args: argparse.Namespace, default: Any) -> Any:
    """The ``StatusSource`` that ``--head-url`` or ``--status-file`` names, else ``default``."""
    from rollcap.status import StatusSource

    if args.head_url is not None:
        return StatusSource(head_url=args.head_url)
    if args.status_file is not None:
        return StatusSource(path=args.status_file)
    return default


def _status(args: argparse.Namespace) -> int:
    import rich.console

    from rollcap.status import StatusSource
    from rollcap.status._terminal import watch
    from rollcap.workflow import head_url

    if not args.interval > 0:
        raise ConfigError(f"--interval must be a positive number of seconds, got {args.interval}")
    source = _status_source(args, StatusSource(head_url=head_url()))
    console = rich.console.Console()
    with contextlib.suppress(KeyboardInterrupt):
        return watch(source, console=console, interval_s=args.interval, once=args.once)
    return EXIT_OK


def _serve_model(args: argparse.Namespace) -> int:
    from rollcap._runtime.serving import bind, serving
    from rollcap.server import ModelServerSettings, create_model_app

    settings = RunSettings.from_config(load_config(args.config, args.overrides))
    _check_capture(settings)
    app = create_model_app(ModelServerSettings.from_run(settings, args.model_type))
    sock = bind(args.host, args.port)
    capture = settings.capture_dir or "off"
    upstream = (
        "the embedded model"
        if args.model_type == "local_model"
        else ", ".join(settings.policy_base_url or ())
        if isinstance(settings.policy_base_url, tuple)
        else settings.policy_base_url
    )

    async def run() -> None:
        timeout = settings.header_read_timeout_s
        async with serving(app, sock=sock, header_timeout_s=timeout) as url:
            print(f"rollcap model server policy_model ({args.model_type}) on {url}"
                  f" -> {upstream}; capture: {capture}", flush=True)  # fmt: skip
            freeze_startup()
            await asyncio.Event().wait()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _run_until_interrupted(run())
    return EXIT_OK


def _serve_worker(args: argparse.Namespace) -> int:
    import os

    from rollcap._runtime.serving import bind, serving
    from rollcap.worker import WorkerSettings, create_worker_app

    api_key: str | None = None
    if args.api_key_env is not None:
        # Named, never given: a key on the command line is readable by every local user.
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env: the environment variable {args.api_key_env} is unset")
    settings = WorkerSettings(
        upstream_url=args.upstream,
        staging_dir=args.staging_dir,
        api_key=api_key,
        weight_version=args.weight_version,
        prefix_cache_ids=args.prefix_cache_ids,
    )
    app = create_worker_app(settings)
    sock = bind(args.host, args.port)

    async def run() -> None:
        async with serving(app, sock=sock) as url:
            print(
                f"rollcap capture worker on {url} -> {settings.upstream_url}; "
                f"staging: {settings.staging_dir}",
                flush=True,
            )
            freeze_startup()
            await asyncio.Event().wait()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _run_until_interrupted(run())
    return EXIT_OK


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: the servers mostly move bytes between sockets, on less CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _ray_took_an_override(args: argparse.Namespace) -> None:
    """``--ray key=value``: argparse took the override for ``--ray``'s address; give it back."""
    if args.ray and "=" in args.ray:
        args.overrides.insert(0, args.ray)
        args.ray = ""


def _eval_run(args: argparse.Namespace) -> int:
    from rollcap.workflow import EvalRequest, Progress, format_summary, run_eval

    _ray_took_an_override(args)
    overrides = [*args.overrides, *(["capture_compress=true"] if args.compress_capture else [])]
    config = load_config(args.config, overrides)
    cluster = _cluster_settings(args, config)
    if cluster is None:
        _check_capture(RunSettings.from_config(config))
    request = EvalRequest(
        agent=args.agent,
        input_path=args.input,
        output_path=args.output,
        limit=args.limit,
        num_repeats=args.num_repeats,
        concurrency=args.concurrency,
        resume=args.resume,
        serve=not args.no_serve,
        model_type=args.model_type,
        head_url=args.head_url,
        head_port=args.head_port,
        wandb_project=args.wandb_project,
        wandb_entity=args.wandb_entity,
        ray=cluster,
    )
    progress = Progress()
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            summary, uncorrelated = runner.run(
                run_eval(request, config, progress=progress, on_started=freeze_startup)
            )
    finally:
        progress.close()
    print(format_summary(summary, uncorrelated))
    return EXIT_OK


def _eval_submit(args: argparse.Namespace) -> int:
    from rollcap.workflow import format_submit_table, submit

    config = load_config([args.config], args.overrides)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        results = runner.run(submit(config))
    print(format_submit_table(results))
    return EXIT_OK


def _env_start(args: argparse.Namespace) -> int:
    from rollcap.workflow import environment

    _ray_took_an_override(args)
    config = load_config(args.config, args.overrides)
    settings = RunSettings.from_config(config)  # a bad configuration starts nothing
    cluster = _cluster_settings(args, config)
    if cluster is None:
        _check_capture(settings)
    options = {
        "model_type": args.model_type,
        "resources_server": args.resources_server,
        "agent": args.agent,
        "host": args.host,
        "head_port": args.head_port,
    }

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            replicas = None
            if cluster is None:
                env = await stack.enter_async_context(environment(config, **options))
            else:
                from rollcap.cluster import cluster_environment

                on_cluster = await stack.enter_async_context(
                    cluster_environment(config, cluster, **options)
                )
                env, replicas = on_cluster.environment, on_cluster.replicas
            for server in env.servers:
                print(f"{server.kind:<22} {server.name:<20} {server.type:<18} {server.url}")
            for replica in [] if replicas is None else replicas.live():
                print(
                    f"{'  replica':<22} {replica.name:<20} {replica.node_id[:16]:<18} {replica.url}"
                )
            print(f"head server on {env.head_url} (GET /servers, GET /config)", flush=True)
            freeze_startup()
            await asyncio.Event().wait()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _run_until_interrupted(run())
    return EXIT_OK


def _run_until_interrupted(main: Coroutine[Any, Any, None]) -> None:
    """Run servers until Ctrl-C or SIGTERM, then stop them in order: a normal stop, exit 0."""

    async def until_signal() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await main

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(until_signal())
    print("stopped", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve" and args.serve_command == "model":
            return _serve_model(args)
        if args.command == "serve" and args.serve_command == "worker":
            return _serve_worker(args)
        if args.command == "env" and args.env_command == "start":
            return _env_start(args)
        if args.command == "eval" and args.eval_command == "run":
            return _eval_run(args)
        if args.command == "eval" and args.eval_command == "submit":
            return _eval_submit(args)
        if args.command == "capture" and args.capture_command == "list":
            return _capture_list(args.directory)
        if args.command == "capture" and args.capture_command == "show":
            return _capture_show(args.directory, args.rollout_id, not args.no_payloads)
        if args.command == "capture" and args.capture_command == "attach":
            return _capture_attach(args)
        if args.command == "capture" and args.capture_command in ("compress", "decompress"):
            return _capture_recompress(args)
        if args.command == "capture" and args.capture_command == "export-otel":
            return _capture_export_otel(args)
        if args.command == "capture" and args.capture_command == "report":
            return _capture_report(args)
        if args.command == "capture" and args.capture_command == "view":
            return _capture_view(args)
        if args.command == "status":
            return _status(args)
        if args.command == "compare":
            return _compare(args)
    except (ConfigError, ValueError, CaptureReadError) as exc:
        print(f"rollcap: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"rollcap: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    raise AssertionError(f"unhandled command {args}")  # argparse allows no other


if __name__ == "__main__":
    sys.exit(main())
