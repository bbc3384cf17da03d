"""The capture lines the model server writes, byte for byte, against those it wrote before its
record was built and encoded once (``fixtures/recorder_lines.jsonl``).

Each scenario feeds a ``CallRecorder`` at fixed clocks; its line is what the server hands the
store and the store writes (``record()`` through the store's encoding), for a record built on
the event loop and for one built in slices in a thread. Rebuild the golden file (only for a
change that means to change the lines) with::

    .venv/bin/python -m tests.server.test_recorder_lines
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from rollcap.records import ErrorCategory
from rollcap.server._recorder import CallFailure, CallRecorder, Clock, LocalReason
from rollcap.store._files import _encode_line

GOLDEN = Path(__file__).parent / "fixtures" / "recorder_lines.jsonl"
STREAMS = Path(__file__).resolve().parent.parent / "fixtures"
SSE = {"content-type": "text/event-stream; charset=utf-8"}
JSON = {"content-type": "application/json"}
START = Clock(wall=1786032154.123456, mono=50.0)
END = Clock(wall=1786032154.987654, mono=50.8641239)

Feed = Callable[[CallRecorder], None]


def _recorder(dialect: str, limit: int | None = None, **extra: object) -> CallRecorder:
    kwargs: dict[str, object] = {"client_session_id": "sess-9", **extra}
    if limit is not None:
        kwargs["max_response_bytes"] = limit
    return CallRecorder(
        model_call_id="0123456789abcdef0123456789abcdef",
        dialect=dialect,
        server_name="policy_model",
        start=START,
        **kwargs,  # type: ignore[arg-type]
    )


def _stream(raw: bytes, *, step: int = 11, upto: int | None = None) -> Feed:
    def feed(recorder: CallRecorder) -> None:
        recorder.upstream_attempt()
        recorder.upstream_status(200)
        recorder.response_start(200, SSE)
        recorder.first_byte(50.0125)
        end = len(raw) if upto is None else upto
        for i in range(0, end, step):
            recorder.body(raw[i : min(i + step, end)])

    return feed


def _answer(status: int, body: bytes, headers: dict[str, str] = JSON) -> Feed:
    def feed(recorder: CallRecorder) -> None:
        recorder.upstream_attempt()
        recorder.upstream_status(status)
        recorder.response_start(status, headers)
        recorder.first_byte(50.25)
        for i in range(0, len(body), 64):
            recorder.body(body[i : i + 64])

    return feed


def _scenarios() -> dict[str, tuple[CallRecorder, Feed, CallFailure | None]]:
    """``name -> (recorder, what it is fed, how the call ends)``; recorders are fresh each call."""
    out: dict[str, tuple[CallRecorder, Feed, CallFailure | None]] = {}
    requests = {
        "json": b'{"model": "m", "stream": true, "input": "caf\\u00e9 \xe2\x9c\x93"}',
        "newline": b'{"model": "m",\n "stream": true}',
        "not-json": b"not json \xff",
        "array": b"[1, 2]",
    }
    for dialect in ("chat", "responses", "messages"):
        for n, path in enumerate(sorted((STREAMS / dialect).glob("*.sse"))):
            raw = path.read_bytes()
            name = f"{dialect}-{path.stem}"
            out[f"stream-{name}"] = (_recorder(dialect), _stream(raw), None)
            if n < 2:  # the bounds and the client leaving, on a few streams of each dialect
                out[f"stream-{name}-cut-at-200"] = (_recorder(dialect, 200), _stream(raw), None)
                out[f"stream-{name}-cut-at-900"] = (_recorder(dialect, 900), _stream(raw), None)
                out[f"stream-{name}-cancelled"] = (
                    _recorder(dialect),
                    _stream(raw, upto=len(raw) // 2),
                    CallFailure.CANCELLED,
                )
            expected = STREAMS / dialect / f"{path.stem}.expected.json"
            if expected.is_file():
                body = orjson.dumps(orjson.loads(expected.read_bytes())["response"])
                out[f"answer-{name}"] = (_recorder(dialect), _answer(200, body), None)
        out[f"answer-{dialect}-pretty"] = (
            _recorder(dialect),
            _answer(200, b'{\n  "id": "x",\n  "status": "incomplete", "choices": []\n}'),
            None,
        )
        out[f"answer-{dialect}-not-json"] = (_recorder(dialect), _answer(200, b"<html>"), None)
        out[f"answer-{dialect}-array"] = (_recorder(dialect), _answer(200, b"[1]"), None)
        out[f"answer-{dialect}-500-empty"] = (_recorder(dialect), _answer(500, b""), None)
        out[f"answer-{dialect}-429"] = (
            _recorder(dialect),
            _answer(429, b'{"error": {"message": "slow down", "type": "rate_limit"}}'),
            None,
        )
        out[f"answer-{dialect}-over-limit"] = (
            _recorder(dialect, 10),
            _answer(200, b'{"id": "x", "choices": []}'),
            None,
        )
        out[f"answer-{dialect}-context"] = (
            _recorder(dialect),
            _answer(
                400,
                b'{"error": {"message": "This model\'s maximum context length is 8 tokens",'
                b' "type": "invalid_request_error", "code": "context_length_exceeded"}}',
            ),
            None,
        )
        for label, request in requests.items():
            recorder = _recorder(dialect)
            recorder.request(request)
            out[f"request-{dialect}-{label}"] = (recorder, _answer(200, b'{"id": "x"}'), None)
        for failure in CallFailure:
            out[f"failed-{dialect}-{failure.value}-before"] = (
                _recorder(dialect),
                _nothing,
                failure,
            )
            out[f"failed-{dialect}-{failure.value}-after"] = (
                _recorder(dialect),
                _answer(200, b'{"id": "x"}'),
                failure,
            )
        out[f"local-{dialect}"] = (_recorder(dialect), _locally, None)
        out[f"upstream-failed-{dialect}"] = (_recorder(dialect), _unreachable, None)
        out[f"no-session-{dialect}"] = (
            _recorder(dialect, client_session_id=None),
            _answer(200, b'{"id": "y"}'),
            None,
        )
    out["socket-responses"] = (_recorder("responses", transport="websocket"), _socket_turn, None)
    return out


def _nothing(recorder: CallRecorder) -> None:
    recorder.request(b'{"model": "m"}')


def _locally(recorder: CallRecorder) -> None:
    recorder.request(b'{"model": "m"}')
    recorder.answered_locally(LocalReason.INVALID_REQUEST)
    recorder.gap("model_call_capture_over_limit", "request: too long")
    recorder.response_start(413, JSON)
    recorder.body(b'{"error": {"message": "too long"}}')


def _unreachable(recorder: CallRecorder) -> None:
    recorder.request(b'{"model": "m"}')
    recorder.upstream_attempt()
    recorder.upstream_failed(ErrorCategory.CONNECTION)
    recorder.context_exceeded()
    recorder.response_start(502, JSON)
    recorder.body(b'{"error": {"message": "unreachable"}}')


def _socket_turn(recorder: CallRecorder) -> None:
    recorder.request(b'{"type": "response.create", "model": "m"}')
    recorder.client_event({"type": "response.steer", "input": "faster"})
    _stream((STREAMS / "responses" / "reasoning_summary_and_text.sse").read_bytes())(recorder)


def _line(name: str, in_slices: bool) -> bytes:
    recorder, feed, failure = _scenarios()[name]
    if not name.startswith(("request-", "failed-", "local-", "upstream-failed-", "socket-")):
        recorder.request(b'{"model": "m", "stream": true}')
    feed(recorder)
    recorder.finish(END, failure)
    record = recorder.record_in_slices() if in_slices else recorder.record()
    return _encode_line(record)


NAMES = sorted(_scenarios())


def _golden() -> dict[str, bytes]:
    out = {}
    for line in GOLDEN.read_bytes().splitlines():
        name, encoded = orjson.loads(line)
        out[name] = encoded.encode()
    return out


def test_every_scenario_has_its_lines() -> None:
    assert sorted(_golden()) == sorted(f"{n} {w}" for n in NAMES for w in ("loop", "slices"))


@pytest.mark.parametrize("name", NAMES)
def test_the_server_writes_the_lines_it_wrote_before(name: str) -> None:
    golden = _golden()
    assert _line(name, in_slices=False) == golden[f"{name} loop"]
    assert _line(name, in_slices=True) == golden[f"{name} slices"]


def main() -> None:
    GOLDEN.parent.mkdir(exist_ok=True)
    with open(GOLDEN, "wb") as out:
        for name in NAMES:
            for way, in_slices in (("loop", False), ("slices", True)):
                line = _line(name, in_slices)
                out.write(orjson.dumps([f"{name} {way}", line.decode()]) + b"\n")
    print(f"{len(NAMES)} scenarios in {GOLDEN}")


if __name__ == "__main__":
    main()
