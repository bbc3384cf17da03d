"""``python -m rollcap.testing [--host H] [--port P] [--api-key K]``: serve the fake upstream.

The first line of stdout is the URL (``http://host:port``); the server runs until SIGINT or
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from rollcap.testing._server import FakeUpstream

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rollcap.testing",
        description="Serve a fake OpenAI / Anthropic model API for tests and benchmarks.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument(
        "--api-key", default=None, help="require this key (Bearer, or x-api-key on /v1/messages)"
    )
    return parser


async def _serve(host: str, port: int, api_key: str | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with FakeUpstream(host=host, port=port, api_key=api_key) as upstream:
            print(upstream.url, flush=True)
            await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        asyncio.run(_serve(args.host, args.port, args.api_key))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
