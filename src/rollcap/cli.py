"""The ``rollcap`` command (also installed as ``gym``): parse, call, map errors to exit codes.

Exit codes: 0 success, 1 a runtime failure (unreadable files and the like), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import orjson

from rollcap import __version__
from rollcap.config import ConfigError, RunSettings, load_config
from rollcap.store import CaptureReadError, CaptureStore, capture_attachment

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


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
    model.add_argument(
        "--config", action="append", default=[], metavar="FILE", help="YAML config (repeatable)"
    )
    model.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="key=value, +key=value or ++key=value"
    )

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
    return parser


def _capture_list(directory: str) -> int:
    store = CaptureStore(directory)
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
    attachment = capture_attachment(CaptureStore(directory), rollout_id, payloads=payloads)
    sys.stdout.buffer.write(orjson.dumps(attachment, option=orjson.OPT_INDENT_2) + b"\n")
    return EXIT_OK


def _serve_model(args: argparse.Namespace) -> int:
    from rollcap._serving import bind, uvicorn_server
    from rollcap.server import ModelServerSettings, create_model_app

    settings = RunSettings.from_config(load_config(args.config, args.overrides))
    app = create_model_app(
        ModelServerSettings(
            model_type=args.model_type,
            base_url=settings.policy_base_url,
            api_key=settings.policy_api_key,
            capture_dir=settings.capture_dir,
            pass_client_credentials=settings.pass_client_credentials,
        )
    )
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    capture = settings.capture_dir or "off"
    upstream = (
        "the embedded model" if args.model_type == "local_model" else settings.policy_base_url
    )
    print(
        f"rollcap model server policy_model ({args.model_type}) on http://{host}:{port}"
        f" -> {upstream}; capture: {capture}",
        flush=True,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server = uvicorn_server(app)
    _run_until_interrupted(server.serve(sockets=[sock]))
    return EXIT_OK


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: it moves bytes between sockets several times faster."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_until_interrupted(main: Coroutine[Any, Any, None]) -> None:
    """Run a server; Ctrl-C or SIGTERM is a normal stop, not a crash.

    uvicorn shuts down gracefully on either signal and then raises it again for the process;
    both arrive here as KeyboardInterrupt.
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=_loop_factory()) as run,
    ):
        run.run(main)
    print("stopped", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve" and args.serve_command == "model":
            return _serve_model(args)
        if args.command == "capture" and args.capture_command == "list":
            return _capture_list(args.directory)
        if args.command == "capture" and args.capture_command == "show":
            return _capture_show(args.directory, args.rollout_id, not args.no_payloads)
    except (ConfigError, ValueError, CaptureReadError) as exc:
        print(f"rollcap: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"rollcap: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    raise AssertionError(f"unhandled command {args}")  # argparse allows no other


if __name__ == "__main__":
    sys.exit(main())
