from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollcap.records import GAP_CAPTURE_OVER_LIMIT, ErrorCategory, RawRecord
from rollcap.server._recorder import CallFailure, CallRecorder, Clock, LocalReason

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SSE = {"content-type": "text/event-stream; charset=utf-8"}
JSON = {"content-type": "application/json"}


def _recorder(dialect: str = "chat") -> CallRecorder:
    recorder = CallRecorder(
        model_call_id="c" * 32,
        dialect=dialect,
        server_name="policy_model",
        start=Clock(wall=1000.0, mono=50.0),
        client_session_id="sess-9",
    )
    recorder.request(b'{"model": "m", "stream": true}')
    return recorder


def _finish(recorder: CallRecorder, end: Clock, failure: CallFailure | None = None) -> RawRecord:
    recorder.finish(end, failure)
    return RawRecord(**recorder.record())


def _feed_stream(recorder: CallRecorder, raw: bytes, step: int = 7) -> list[int]:
    """Feed ``raw`` in chunks; the indices of chunks that completed the terminal event."""
    terminal_at = []
    for n, i in enumerate(range(0, len(raw), step)):
        if recorder.body(raw[i : i + step]):
            terminal_at.append(n)
    return terminal_at


def test_complete_stream_record() -> None:
    raw = (FIXTURES / "chat" / "text_with_usage.sse").read_bytes()
    recorder = _recorder()
    recorder.response_start(200, SSE)
    recorder.first_byte(50.0125)
    terminal = _feed_stream(recorder, raw)
    # The terminal event is completed by the chunk holding the end of "data: [DONE]\n\n".
    assert terminal == [(len(raw) - 1) // 7]
    record = _finish(recorder, Clock(wall=1000.5, mono=50.5))
    expected = orjson.loads((FIXTURES / "chat" / "text_with_usage.expected.json").read_bytes())
    assert record.response == expected["response"]
    assert record.response_raw == raw.decode()
    assert record.request == {"model": "m", "stream": True}
    assert record.status_code == 200
    assert record.error_category is None
    assert record.latency_ms == 500.0
    assert record.latency_ttft_ms == 12.5
    assert record.started_at == 1000.0
    assert record.completed_at == 1000.5
    assert record.client_session_id == "sess-9"
    assert record.model_ref == {"type": "responses_api_models", "name": "policy_model"}


def test_only_one_record_per_call() -> None:
    recorder = _recorder()
    with pytest.raises(RuntimeError, match="not finished"):
        recorder.record()
    recorder.finish(Clock(1, 1))
    with pytest.raises(RuntimeError, match="already recorded"):
        recorder.finish(Clock(1, 1))
    assert recorder.record() == recorder.record()  # building it twice gives the same record


@pytest.mark.parametrize(
    ("dialect", "fixture", "category"),
    [
        ("chat", "truncated", "stream_truncated"),
        ("chat", "error_midstream", "upstream_error"),
        ("responses", "incomplete_max_output_tokens", "incomplete"),
        ("responses", "response_failed", "upstream_error"),
        ("messages", "error_overloaded", "upstream_error"),
        ("messages", "truncated_mid_text", "stream_truncated"),
    ],
)
def test_stream_endings(dialect: str, fixture: str, category: str) -> None:
    recorder = _recorder(dialect)
    recorder.response_start(200, SSE)
    _feed_stream(recorder, (FIXTURES / dialect / f"{fixture}.sse").read_bytes())
    assert _finish(recorder, Clock(1, 1)).error_category == category


def test_client_gone_mid_stream_is_cancelled_not_truncated() -> None:
    recorder = _recorder()
    recorder.response_start(200, SSE)
    raw = (FIXTURES / "chat" / "text_with_usage.sse").read_bytes()
    recorder.body(raw[: raw.index(b"\n\n", 300) + 2])
    record = _finish(recorder, Clock(1, 1), CallFailure.CANCELLED)
    assert record.error_category == "cancelled"
    assert record.response is not None  # the partial reconstruction is kept


@pytest.mark.parametrize(
    ("status", "body", "category"),
    [
        (200, b'{"id": "x"}', None),
        (200, b"<html>not json", "capture_parse_error"),
        (200, b"[1, 2]", "capture_parse_error"),
        (429, b'{"error": {"message": "slow down"}}', "rate_limit"),
        (500, b"Internal Server Error", "upstream_error"),
        (401, b'{"error": {}}', "auth"),
    ],
)
def test_non_stream_bodies(status: int, body: bytes, category: str | None) -> None:
    recorder = _recorder()
    recorder.response_start(status, JSON)
    assert recorder.body(body) is False  # nothing to hold back chunk by chunk
    record = _finish(recorder, Clock(1, 1))
    assert record.status_code == status
    assert record.error_category == category
    if record.response is None:
        assert record.response_raw == body.decode()


def test_responses_incomplete_non_stream() -> None:
    recorder = _recorder("responses")
    recorder.response_start(200, JSON)
    recorder.body(b'{"id": "resp_1", "status": "incomplete"}')
    assert _finish(recorder, Clock(1, 1)).error_category == "incomplete"


@pytest.mark.parametrize(
    ("failure", "category"),
    [(CallFailure.CONNECTION, "connection"), (CallFailure.TIMEOUT, "timeout")],
)
def test_failure_before_response_ignores_the_servers_own_answer(
    failure: CallFailure, category: str
) -> None:
    recorder = _recorder()
    recorder.fail(failure)
    recorder.response_start(502, JSON)  # rollcap's own error answer, not upstream data
    recorder.body(b'{"error": {"message": "upstream unreachable"}}')
    record = _finish(recorder, Clock(1, 1))
    assert record.status_code is None
    assert record.response is None
    assert record.error_category == category
    assert record.latency_ttft_ms is None


def test_exception_before_any_response() -> None:
    record = _finish(_recorder(), Clock(1, 1), CallFailure.EXCEPTION)
    assert record.status_code == 500
    assert record.error_category == "upstream_error"


def test_request_that_is_not_json_is_kept_raw() -> None:
    recorder = _recorder()
    recorder.request(b"{broken")
    record = _finish(recorder, Clock(1, 1))
    assert record.request is None
    assert record.request_raw == "{broken"


@pytest.mark.parametrize(
    ("category", "expected"),
    [
        (ErrorCategory.TIMEOUT, "timeout"),
        (ErrorCategory.CONNECTION, "connection"),
        (ErrorCategory.STREAM_TRUNCATED, None),  # not a failure the server notes: what came tells
    ],
)
def test_an_upstream_failure_is_noted_as_its_category(
    category: ErrorCategory, expected: str | None
) -> None:
    recorder = _recorder()
    recorder.upstream_failed(category)
    recorder.response_start(200, JSON)  # the server's own answer, when a failure was noted
    recorder.body(b"{}")
    record = _finish(recorder, Clock(wall=1001.0, mono=51.0))
    assert record.error_category == expected
    assert record.status_code == (None if expected else 200)


# -- how the answer came about: the execution fields --------------------------------------------


def _execution(record: RawRecord) -> tuple[object, ...]:
    return (
        record.upstream_attempted,
        record.response_source,
        record.upstream_status_code,
        record.local_response_reason,
    )


def test_an_upstream_answer_is_the_upstreams() -> None:
    recorder = _recorder()
    recorder.upstream_attempt()
    recorder.upstream_status(200)
    recorder.response_start(200, JSON)
    recorder.body(b'{"id": "x"}')
    record = _finish(recorder, Clock(1, 1))
    assert _execution(record) == (True, "upstream", 200, None)
    assert record.to_json()["response_source"] == "upstream"


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (CallFailure.CONNECTION, LocalReason.UPSTREAM_UNREACHABLE),
        (CallFailure.TIMEOUT, LocalReason.UPSTREAM_TIMEOUT),
    ],
)
def test_an_upstream_that_never_answered_gets_the_servers_own_answer(
    failure: CallFailure, reason: LocalReason
) -> None:
    recorder = _recorder()
    recorder.upstream_attempt()
    recorder.fail(failure)
    recorder.response_start(502, JSON)
    recorder.body(b'{"error": {"message": "upstream unreachable"}}')
    assert _execution(_finish(recorder, Clock(1, 1))) == (True, "local", None, reason.value)


def test_an_answer_read_too_slowly_keeps_the_upstreams_status() -> None:
    recorder = _recorder()
    recorder.upstream_attempt()
    recorder.upstream_status(200)
    recorder.upstream_failed(ErrorCategory.TIMEOUT)
    recorder.response_start(504, JSON)
    record = _finish(recorder, Clock(1, 1))
    assert _execution(record) == (True, "local", 200, "upstream_timeout")
    assert record.error_category == "timeout"


def test_a_request_refused_before_upstream_was_never_attempted() -> None:
    recorder = _recorder("responses")
    recorder.answered_locally(LocalReason.INVALID_REQUEST)
    recorder.answered_locally(LocalReason.SERVER_ERROR)  # the first reason stays
    recorder.response_start(400, JSON)
    recorder.body(b'{"error": {"message": "invalid request: not an object"}}')
    record = _finish(recorder, Clock(1, 1))
    assert _execution(record) == (False, "local", None, "invalid_request")
    assert record.status_code == 400
    assert record.response == {"error": {"message": "invalid request: not an object"}}


def test_an_exception_before_any_answer_is_a_local_server_error() -> None:
    recorder = _recorder()
    recorder.upstream_attempt()
    record = _finish(recorder, Clock(1, 1), CallFailure.EXCEPTION)
    assert _execution(record) == (True, "local", None, "server_error")


def test_a_client_gone_before_any_answer_got_none() -> None:
    recorder = _recorder()
    recorder.upstream_attempt()
    record = _finish(recorder, Clock(1, 1), CallFailure.CANCELLED)
    assert _execution(record) == (True, None, None, None)


def test_a_client_gone_mid_stream_got_the_upstreams_answer() -> None:
    recorder = _recorder()
    recorder.upstream_status(200)
    recorder.response_start(200, SSE)
    recorder.body(b'data: {"id": "c", "choices": []}\n\n')
    record = _finish(recorder, Clock(1, 1), CallFailure.CANCELLED)
    assert _execution(record) == (True, "upstream", 200, None)


_VLLM_CONTEXT = (
    b'{"object": "error", "message": "This model\'s maximum context length is 32768 tokens. '
    b'However, you requested 32818 tokens in the messages.", "type": "BadRequestError", '
    b'"param": null, "code": 400}'
)
_OPENAI_CONTEXT = (
    b'{"error": {"message": "Your input exceeds the context window of this model.", '
    b'"type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}'
)
_EMBEDDED_CONTEXT = (
    b'{"error": {"message": "the prompt is 9000 tokens", "type": "invalid_request_error", '
    b'"param": "messages", "code": "context_length_exceeded"}}'
)


@pytest.mark.parametrize(
    ("dialect", "body", "category"),
    [
        ("chat", _VLLM_CONTEXT, "context_length_exceeded"),
        ("responses", _OPENAI_CONTEXT, "context_length_exceeded"),
        ("chat", _EMBEDDED_CONTEXT, "context_length_exceeded"),
        (
            "messages",
            b'{"type": "error", "error": {"type": "invalid_request_error", '
            b'"message": "prompt is too long: 215000 tokens > 200000 maximum"}}',
            "context_length_exceeded",
        ),
        ("chat", b'{"error": {"message": "temperature must be at most 2"}}', "client_error"),
    ],
)
def test_an_upstream_refusing_a_prompt_too_long_is_context_length_exceeded(
    dialect: str, body: bytes, category: str
) -> None:
    recorder = _recorder(dialect)
    recorder.upstream_status(400)
    recorder.response_start(400, JSON)
    recorder.body(body)
    record = _finish(recorder, Clock(1, 1))
    assert record.error_category == category
    assert _execution(record) == (True, "upstream", 400, None)


def test_a_reshaped_context_error_is_still_context_length_exceeded() -> None:
    # A Messages client of a chat upstream gets Anthropic's shape, without the upstream's code.
    recorder = _recorder("messages")
    recorder.upstream_status(400)
    recorder.context_exceeded()
    recorder.response_start(400, JSON)
    recorder.body(b'{"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}')
    assert _finish(recorder, Clock(1, 1)).error_category == "context_length_exceeded"


def test_the_servers_own_400_is_never_the_upstreams_context_error() -> None:
    recorder = _recorder()
    recorder.answered_locally(LocalReason.INVALID_REQUEST)
    recorder.response_start(400, JSON)
    recorder.body(_OPENAI_CONTEXT)
    assert _finish(recorder, Clock(1, 1)).error_category == "client_error"


# --- bounded by max_response_bytes ------------------------------------------------------------


def _bounded(dialect: str, limit: int) -> CallRecorder:
    recorder = CallRecorder(
        model_call_id="c" * 32,
        dialect=dialect,
        server_name="policy_model",
        start=Clock(wall=1000.0, mono=50.0),
        max_response_bytes=limit,
    )
    recorder.request(b'{"model": "m", "stream": true}')
    return recorder


def _chat_stream(deltas: int, text: str = "x" * 100) -> bytes:
    # A long model name: the stream is much longer than its text, as real streams are.
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m" * 300}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        for _ in range(deltas)
    ]
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + b"data: [DONE]\n\n"


def test_past_the_limit_the_raw_text_stops_and_the_answer_is_still_whole() -> None:
    raw = _chat_stream(200)  # ~94 KB of stream, 20 KB of text
    recorder = _bounded("chat", 50_000)
    recorder.response_start(200, SSE)
    terminal = _feed_stream(recorder, raw, step=1000)
    assert terminal == [(len(raw) - 1) // 1000]  # the end still counts
    # The raw text up to the bound, each delta's text, and the first chunk whole: its top level
    # (the long model name) is kept for the answer.
    first = len(raw.split(b"\n\n")[0]) - len(b"data: ")
    assert recorder.kept_bytes < 50_000 + 200 * (100 + 64) + first + 64 + 100
    record = _finish(recorder, Clock(1, 1))
    assert record.error_category is None
    assert record.response_raw == raw[:50_000].decode()
    assert record.response is not None
    assert record.response["choices"][0]["message"]["content"] == "x" * 100 * 200
    assert record.gaps == [
        {
            "code": GAP_CAPTURE_OVER_LIMIT,
            "detail": f"response_raw: the first 50000 of {len(raw)} bytes "
            "(capture_max_response_bytes)",
        }
    ]


def test_past_the_limit_the_answer_stops_too_but_the_end_still_decides() -> None:
    raw = _chat_stream(400, "y" * 200)
    recorder = _bounded("chat", 20_000)
    recorder.response_start(200, SSE)
    _feed_stream(recorder, raw, step=500)
    # Held: the bound twice (the raw text, the answer), one chunk more at most.
    assert recorder.kept_bytes < 2 * 20_000 + 500 + 100
    record = _finish(recorder, Clock(1, 1))
    assert record.error_category is None  # [DONE] came: a complete call, not a truncated one
    assert record.response is not None
    content = record.response["choices"][0]["message"]["content"]
    assert content == "y" * len(content)
    assert 0 < len(content) < 20_000
    codes = [gap["code"] for gap in record.gaps or []]
    assert codes == [GAP_CAPTURE_OVER_LIMIT, GAP_CAPTURE_OVER_LIMIT]
    assert (record.gaps or [])[1]["detail"].startswith("response: reassembled from the stream's")


def test_a_line_longer_than_the_limit_is_let_go_and_said() -> None:
    recorder = _bounded("chat", 10_000)
    recorder.response_start(200, SSE)
    recorder.body(b"data: " + b"z" * 6000)
    recorder.body(b"z" * 6000)  # past the limit: let go, not held
    recorder.body(b"z\n\ndata: [DONE]\n\n")
    assert recorder.kept_bytes < 10_000 + 1000
    record = _finish(recorder, Clock(1, 1))
    assert "1 lines longer than that were dropped" in (record.gaps or [])[1]["detail"]


def test_a_non_streamed_body_past_the_limit_is_not_kept() -> None:
    body = orjson.dumps({"id": "x", "text": "w" * 5000})
    recorder = _bounded("chat", 1000)
    recorder.response_start(200, JSON)
    recorder.body(body[:3000])
    recorder.body(body[3000:])
    record = _finish(recorder, Clock(1, 1))
    assert (record.response, record.response_raw, record.error_category) == (None, None, None)
    assert record.gaps == [
        {
            "code": GAP_CAPTURE_OVER_LIMIT,
            "detail": f"response: a body of {len(body)} bytes, over "
            "capture_max_response_bytes=1000, was not kept",
        }
    ]


def _same_json(slices: dict[str, object], record: RawRecord) -> None:
    """What a reader of the line gets, and the keys in the same order."""
    line = orjson.loads(orjson.dumps(slices))
    assert line == orjson.loads(orjson.dumps(record.to_json()))
    assert list(line) == list(record.to_json())


_STREAMS = sorted(
    p.relative_to(FIXTURES)
    for d in ("chat", "responses", "messages")
    for p in (FIXTURES / d).glob("*.sse")
)


@pytest.mark.parametrize("fixture", _STREAMS, ids=str)
def test_a_record_built_in_slices_is_the_record(fixture: Path) -> None:
    # Built off the event loop for a big call, the record must be the one record() builds.
    dialect = fixture.parts[0]
    raw = (FIXTURES / fixture).read_bytes()
    twins = [_recorder(dialect), _recorder(dialect)]
    for recorder in twins:
        recorder.request(b'{"model": "m",\n "stream": true}')  # a line break: encoded again
        recorder.response_start(200, SSE)
        recorder.first_byte(50.01)
        _feed_stream(recorder, raw, step=13)
        recorder.finish(Clock(1000.5, 50.5))
    _same_json(twins[1].record_in_slices(), RawRecord(**twins[0].record()))


@pytest.mark.parametrize(
    ("status", "body"),
    [(200, b'{"id": "x", "choices": []}'), (200, b"<html>"), (500, b""), (200, b'{"a":\n1}')],
)
def test_a_non_streamed_record_built_in_slices_is_the_record(status: int, body: bytes) -> None:
    twins = [_recorder(), _recorder()]
    for recorder in twins:
        recorder.request(b"not json")
        recorder.response_start(status, JSON)
        recorder.body(body)
        recorder.finish(Clock(1, 1))
    _same_json(twins[1].record_in_slices(), RawRecord(**twins[0].record()))


def test_release_lets_go_of_what_the_call_kept() -> None:
    recorder = _recorder()
    recorder.response_start(200, SSE)
    _feed_stream(recorder, _chat_stream(100))
    recorder.finish(Clock(1, 1))
    assert recorder.kept_bytes > 20_000
    recorder.record()
    recorder.release()
    assert recorder.kept_bytes == len(b'{"model": "m", "stream": true}')
