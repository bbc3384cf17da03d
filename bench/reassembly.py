"""Stream reassembly's cost per stream, against the SSE decoding under it and the official SDKs.

    .venv/bin/python bench/reassembly.py [--events N] [--rounds N]

For each dialect, one fake-upstream stream of N text deltas (default 50), timed three ways in
one process, rounds alternating: the SSE decoding alone (the floor every capture pays), decoding
plus rollcap's reassembly (what the model server runs on the event loop for each captured
stream), and the official SDK's stream helper over the same bytes (an in-process transport; the
work a client does to get its final object). Reported: the fastest round's microseconds per
stream, and reassembly's share above the floor.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.dialects._sdk import sdk_final

from rollcap.dialects import get_dialect
from rollcap.sse import SSEDecoder
from rollcap.testing._knobs import DIALECTS, HEADER_EVENTS
from rollcap.testing._scenarios import answer

_BODY = {
    "model": "text",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
    "input": "hi",
    "max_tokens": 64,
    "stream_options": {"include_usage": True},
}


def _stream(dialect: str, events: int) -> bytes:
    reply = answer(dialect, orjson.dumps(_BODY), {HEADER_EVENTS: str(events)}, request_id="b")
    return b"".join(reply.events)


def _decode(raw: bytes) -> None:
    decoder = SSEDecoder()
    for _ in decoder.feed(raw):
        pass


def _reassemble(dialect: str) -> Callable[[bytes], None]:
    new = get_dialect(dialect).new_reassembler

    def run(raw: bytes) -> None:
        decoder = SSEDecoder()
        reassembler = new()
        for event in decoder.feed(raw):
            reassembler.feed(event)
        reassembler.finish()

    return run


def _sdk(dialect: str) -> Callable[[bytes], None]:
    def run(raw: bytes) -> None:
        sdk_final(dialect, raw)

    return run


def _timed(work: Callable[[bytes], None], raw: bytes, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        work(raw)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"{args.events} text deltas a stream, fastest of {args.rounds} alternating rounds")
    print(f"{'':10} {'events':>6} {'decode us':>10} {'+reassemble':>12} {'SDK us':>8} {'share':>6}")
    for dialect in DIALECTS:
        raw = _stream(dialect, args.events)
        events = raw.count(b"\n\n")
        arms: dict[str, Callable[[bytes], None]] = {
            "decode": _decode,
            "reassemble": _reassemble(dialect),
            "sdk": _sdk(dialect),
        }
        best = {name: float("inf") for name in arms}
        for _ in range(args.rounds):
            for name, work in arms.items():
                repeat = 20 if name == "sdk" else 400
                best[name] = min(best[name], _timed(work, raw, repeat))
        above = best["reassemble"] - best["decode"]
        print(
            f"{dialect:10} {events:>6} {best['decode']:>10.1f} {best['reassemble']:>12.1f} "
            f"{best['sdk']:>8.0f} {above / best['sdk']:>6.1%}"
        )
    print("share: reassembly above decoding, as a fraction of the SDK's own accumulation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
