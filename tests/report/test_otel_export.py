"""`rollcap capture export-otel` against an OTLP/HTTP receiver on 127.0.0.1 decoding the protobuf.

The capture is real: calls from the official SDKs through capturing model servers to the fake
upstream (text, tools, reasoning, streamed and not, a 429, a mid-stream error, a cut stream).
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from starlette.applications import Starlette

from rollcap._runtime.serving import serving_in_thread
from rollcap.cli import main
from rollcap.report import OTEL_INSTALL_HINT, RUN_KEY_FILE, export_otel, run_key_of
from rollcap.report._otel_cli import format_export
from rollcap.report._otel_export import GIVE_UP_AFTER
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.conftest import SECRETS

UPSTREAM_KEY, CLIENT_KEY = SECRETS
SCENARIO = "x-fake-scenario"
TOOLS_CHAT: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "pick_option",
            "parameters": {
                "type": "object",
                "properties": {"letter": {"type": "string", "enum": ["A", "B"]}},
                "required": ["letter"],
            },
        },
    }
]
TOOLS_RESPONSES: list[Any] = [{"type": "function", **TOOLS_CHAT[0]["function"]}]
TOOLS_MESSAGES: list[Any] = [
    {"name": "pick_option", "input_schema": TOOLS_CHAT[0]["function"]["parameters"]}
]


# --- the receiver -------------------------------------------------------------------------------


@dataclass
class Receiver:
    """Answers each export with the next status of ``answers`` (then 200) and keeps what it
    decoded from the requests it accepted."""

    url: str = ""
    answers: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[Span]:
        return [
            span
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def reset(self) -> None:
        with self.lock:
            self.statuses.clear()
            self.requests.clear()


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            request = ExportTraceServiceRequest.FromString(body)
            with receiver.lock:
                status = receiver.answers.pop(0) if receiver.answers else 200
                receiver.statuses.append(status)
                if status == 200:
                    receiver.requests.append(request)
            reply = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
            self.send_response(status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            if status == 503:
                self.send_header("retry-after", "0")
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    state = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    state.url = f"http://{host!s}:{port}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{state.url}/v1/traces")
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def attributes(span: Span) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    assert kind is not None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return (kind, getattr(value, kind))


def plain(span: Span) -> dict[str, Any]:
    """Attributes without their wire types."""
    out = {}
    for key, value in attributes(span).items():
        out[key] = [v[1] for v in value] if isinstance(value, list) else value[1]
    return out


def by_trace(spans: list[Span]) -> dict[bytes, list[Span]]:
    traces: dict[bytes, list[Span]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


# --- a real capture -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    directory: Path
    rollouts: Path


def _make_calls(openai_url: str, anthropic_url: str, http: httpx2.Client) -> None:
    def oa(rollout_id: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{openai_url}/ng-rollout/{rollout_id}/v1",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )

    def an(rollout_id: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=f"{anthropic_url}/ng-rollout/{rollout_id}",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )

    client = oa("0-0")
    client.responses.create(model="fake-model", input="Which option?")
    list(
        client.responses.create(
            model="fake-model",
            input="Which option?",
            tools=TOOLS_RESPONSES,
            stream=True,
            extra_headers={SCENARIO: "tool"},
        )
    )
    list(
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "Think first."}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={SCENARIO: "reasoning"},
        )
    )
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "Again?"}],
            extra_headers={SCENARIO: "http_429"},
        )

    messages = an("0-1").messages
    messages.create(
        model="fake-model",
        max_tokens=128,
        messages=[{"role": "user", "content": "Which option?"}],
        tools=TOOLS_MESSAGES,
        extra_headers={SCENARIO: "tool"},
    )
    with (
        pytest.raises(anthropic.APIError),
        messages.stream(
            model="fake-model",
            max_tokens=128,
            messages=[{"role": "user", "content": "Which option?"}],
            extra_headers={SCENARIO: "stream_error"},
        ) as stream,
    ):
        stream.get_final_message()
    with pytest.raises((openai.APIError, httpx2.HTTPError)):
        list(
            oa("0-1").chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": "Which option?"}],
                stream=True,
                extra_headers={SCENARIO: "truncate"},
            )
        )

    oa("1-0-a1").chat.completions.create(
        model="fake-model",
        messages=[
            {"role": "system", "content": "Answer with one letter."},
            {"role": "user", "content": "Which option?"},
        ],
        temperature=0.5,
        tools=TOOLS_CHAT,
        extra_headers={SCENARIO: "tool"},
    )
    oa("2-0").chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "Which option?"}]
    )


@pytest.fixture(scope="module")
def real_capture(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    root = tmp_path_factory.mktemp("otel-capture")
    directory = root / "model-calls"
    with FakeUpstream.running_in_thread(api_key=UPSTREAM_KEY) as upstream:

        def app(model_type: str) -> Starlette:
            return create_model_app(
                ModelServerSettings(
                    model_type=model_type,
                    base_url=upstream.url + "/v1",
                    api_key=UPSTREAM_KEY,
                    capture_dir=directory,
                )
            )

        openai_app = app("openai_model")
        anthropic_app = app("anthropic_model")
        with (
            serving_in_thread(openai_app) as openai_url,
            serving_in_thread(anthropic_app) as anthropic_url,
            httpx2.Client() as http,
        ):
            _make_calls(openai_url, anthropic_url, http)
    store = CaptureStore(directory)
    with store.path_for("2-0").open("ab") as handle:
        handle.write(b'{"torn')  # a crash mid-line
    store.mark_incomplete("2-0")

    agent = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
    rollouts = root / "rollouts.jsonl"
    lines = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": 0, "rollout_id": "0-0"},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "_ng_attempt_index": 0, "rollout_id": "0-1"},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "_ng_attempt_index": 0, "rollout_id": "2-0"},
        {"_ng_task_index": 9, "_ng_rollout_index": 9, "_ng_attempt_index": 0, "rollout_id": "9-9"},
    ]
    rewards = [1.0, 0.0, 0.5, 1.0]
    with rollouts.open("wb") as out:
        for line, reward in zip(lines, rewards, strict=True):
            full = {"agent_ref": agent, **line, "response": {}, "reward": reward}
            out.write(orjson.dumps(full) + b"\n")
        out.write(b"not json\n")
    failure = {
        "_ng_task_index": 1,
        "_ng_rollout_index": 0,
        "_ng_attempt_index": 1,
        "rollout_id": "1-0-a1",
        "error": {"kind": "agent_http_error", "message": "agent answered 500"},
    }
    (root / "rollouts_failures.jsonl").write_bytes(orjson.dumps(failure) + b"\n")
    return Capture(directory, rollouts)


@pytest.fixture
def capture(real_capture: Capture, tmp_path: Path) -> Capture:
    """A private copy: exports store the run key in the directory."""
    directory = tmp_path / "model-calls"
    shutil.copytree(real_capture.directory, directory)
    rollouts = tmp_path / "rollouts.jsonl"
    shutil.copy(real_capture.rollouts, rollouts)
    shutil.copy(real_capture.rollouts.with_name("rollouts_failures.jsonl"), tmp_path)
    return Capture(directory, rollouts)


def _export(capture: Capture, *extra: str) -> int:
    return main(["capture", "export-otel", str(capture.directory), *extra])


# --- tests --------------------------------------------------------------------------------------


def test_one_trace_per_rollout_with_calls_as_children_of_the_root(
    capture: Capture, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _export(capture, "--rollouts", str(capture.rollouts)) == 0
    out, err = capsys.readouterr()
    store = CaptureStore(capture.directory)
    calls = {rid: store.read_available(rid).records for rid in store.rollout_ids()}
    assert sorted(calls) == ["0-0", "0-1", "1-0-a1", "2-0"]
    total = len(calls) + sum(len(records) for records in calls.values())
    assert f"sent {total} of {total} spans (4 traces) to {receiver.url}/v1/traces" in out
    assert "widen your viewer's time range" in out
    assert "without a capture file: 1 rollouts (9-9)" in err
    assert "unreadable lines in the rollouts files: 1" in err

    spans = receiver.spans()
    assert len(spans) == total
    for trace in by_trace(spans).values():
        [root] = [s for s in trace if not s.parent_span_id]
        assert root.kind == Span.SPAN_KIND_INTERNAL
        rollout_id = plain(root)["rollcap.rollout_id"]
        children = [s for s in trace if s.parent_span_id]
        assert all(s.parent_span_id == root.span_id for s in children)
        assert all(s.kind == Span.SPAN_KIND_CLIENT for s in children)
        records = calls[rollout_id]
        assert len(children) == len(records)
        # Historical timestamps, in file order.
        by_index = sorted(children, key=lambda s: plain(s)["rollcap.call_index"])
        for span, (index, raw) in zip(by_index, records, strict=True):
            assert plain(span)["rollcap.call_index"] == index
            assert plain(span)["rollcap.model_call_id"] == raw["model_call_id"]
            assert span.start_time_unix_nano == round(raw["started_at"] * 1e9)
            assert span.end_time_unix_nano == round(raw["completed_at"] * 1e9)
        assert root.start_time_unix_nano == min(s.start_time_unix_nano for s in children)
        assert root.end_time_unix_nano == max(s.end_time_unix_nano for s in children)

    [resource] = {
        tuple(sorted((kv.key, kv.value.string_value) for kv in r.resource.attributes))
        for request in receiver.requests
        for r in request.resource_spans
    }
    assert ("service.name", "rollcap") in resource


def test_attributes_arrive_with_their_semantic_convention_types(
    capture: Capture, receiver: Receiver
) -> None:
    assert _export(capture, "--rollouts", str(capture.rollouts)) == 0
    spans = receiver.spans()
    roots = {plain(s)["rollcap.rollout_id"]: s for s in spans if not s.parent_span_id}
    calls = {
        (plain(s)["gen_ai.conversation.id"], plain(s)["rollcap.call_index"]): s
        for s in spans
        if s.parent_span_id
    }

    root = attributes(roots["0-0"])
    assert roots["0-0"].name == "invoke_agent mcqa_simple_agent"
    assert root["gen_ai.operation.name"] == ("string_value", "invoke_agent")
    assert root["gen_ai.agent.name"] == ("string_value", "mcqa_simple_agent")
    assert root["rollcap.reward"] == ("double_value", 1.0)
    assert root["rollcap.task_index"] == ("int_value", 0)
    assert roots["0-0"].status.code == Status.STATUS_CODE_UNSET

    failed_root = roots["1-0-a1"]
    assert failed_root.name == "invoke_agent rollout"  # a failure line names no agent
    assert failed_root.status.code == Status.STATUS_CODE_ERROR
    assert failed_root.status.message == "agent answered 500"
    assert plain(failed_root)["error.type"] == "agent_http_error"
    assert plain(failed_root)["rollcap.attempt_index"] == 1

    text = attributes(calls[("0-0", 0)])
    assert calls[("0-0", 0)].name == "chat fake-model"
    assert text["gen_ai.provider.name"] == ("string_value", "openai")
    assert text["openai.api.type"] == ("string_value", "responses")
    assert text["gen_ai.usage.input_tokens"][0] == "int_value"
    assert text["gen_ai.usage.output_tokens"][0] == "int_value"
    assert text["gen_ai.usage.cache_read.input_tokens"][0] == "int_value"
    assert text["gen_ai.request.stream"] == ("bool_value", False)
    assert "gen_ai.response.time_to_first_chunk" not in text  # not streamed

    tool_stream = attributes(calls[("0-0", 1)])
    assert tool_stream["gen_ai.request.stream"] == ("bool_value", True)
    kind, ttft = tool_stream["gen_ai.response.time_to_first_chunk"]
    assert kind == "double_value"
    assert 0 < ttft < 60  # seconds, not milliseconds
    assert tool_stream["rollcap.tool_call.names"] == [("string_value", "pick_option")]

    reasoning = attributes(calls[("0-0", 2)])
    assert reasoning["openai.api.type"] == ("string_value", "chat_completions")
    assert reasoning["gen_ai.response.finish_reasons"] == [("string_value", "stop")]
    assert reasoning["gen_ai.usage.reasoning.output_tokens"][0] == "int_value"

    rate_limited = calls[("0-0", 3)]
    assert rate_limited.status.code == Status.STATUS_CODE_ERROR
    assert plain(rate_limited)["error.type"] == "rate_limit"
    assert attributes(rate_limited)["http.response.status_code"] == ("int_value", 429)
    assert not [k for k in plain(rate_limited) if k.startswith("gen_ai.usage.")]

    anthropic_tool = plain(calls[("0-1", 0)])
    assert anthropic_tool["gen_ai.provider.name"] == "anthropic"
    assert anthropic_tool["gen_ai.response.finish_reasons"] == ["tool_use"]
    assert anthropic_tool["gen_ai.request.max_tokens"] == 128
    stream_error, truncated = calls[("0-1", 1)], calls[("0-1", 2)]
    assert stream_error.status.code == Status.STATUS_CODE_ERROR
    assert plain(stream_error)["error.type"] == "upstream_error"
    assert truncated.status.code == Status.STATUS_CODE_ERROR
    assert plain(truncated)["error.type"] == "stream_truncated"
    assert plain(calls[("1-0-a1", 0)])["gen_ai.request.temperature"] == 0.5

    # Content is off by default.
    for span in spans:
        assert not [k for k in plain(span) if k.endswith(".messages") or "capture." in k]

    # The torn line and the incomplete marker are events on the root, not errors.
    damaged = roots["2-0"]
    assert damaged.status.code == Status.STATUS_CODE_UNSET
    gaps = {plain_event["code"] for plain_event in map(_event_attributes, damaged.events)}
    assert gaps == {"model_call_capture_records_unreadable", "model_call_capture_incomplete"}
    assert all(e.name == "rollcap.gap" for e in damaged.events)


def _event_attributes(event: Span.Event) -> dict[str, Any]:
    return {kv.key: kv.value.string_value for kv in event.attributes}


def test_a_second_export_gives_the_same_ids(capture: Capture, receiver: Receiver) -> None:
    first = export_otel(capture.directory, rollouts=capture.rollouts)
    ids = {(s.trace_id, s.span_id, s.parent_span_id) for s in receiver.spans()}
    receiver.reset()
    second = export_otel(capture.directory, rollouts=capture.rollouts)
    assert {(s.trace_id, s.span_id, s.parent_span_id) for s in receiver.spans()} == ids
    assert first.spans_sent == second.spans_sent == len(ids)
    key = (capture.directory / RUN_KEY_FILE).read_text().strip()
    assert run_key_of(capture.directory) == key

    receiver.reset()
    other = export_otel(capture.directory, run_key="another-key")
    assert other.spans_sent == len(ids)
    assert not {(s.trace_id, s.span_id) for s in receiver.spans()} & {i[:2] for i in ids}


def test_content_full_and_ref(capture: Capture, receiver: Receiver) -> None:
    assert _export(capture, "--content", "full") == 0
    children = [plain(s) for s in receiver.spans() if s.parent_span_id]
    calls = {span["rollcap.model_call_id"]: span for span in children}
    store = CaptureStore(capture.directory)
    [(_, tool_call)] = store.read_available("1-0-a1").records
    span = calls[tool_call["model_call_id"]]
    inputs = orjson.loads(span["gen_ai.input.messages"])
    assert [m["role"] for m in inputs] == ["system", "user"]
    [output] = orjson.loads(span["gen_ai.output.messages"])
    assert output["finish_reason"] == "tool_calls"
    assert output["parts"][-1]["name"] == "pick_option"
    assert orjson.loads(span["gen_ai.tool.definitions"])[0]["name"] == "pick_option"

    receiver.reset()
    assert _export(capture, "--content", "ref") == 0
    for span_attributes in (plain(s) for s in receiver.spans() if s.parent_span_id):
        assert "gen_ai.input.messages" not in span_attributes
        path = Path(span_attributes["rollcap.capture.file"])
        line = path.read_bytes().splitlines()[span_attributes["rollcap.capture.line"] - 1]
        assert orjson.loads(line)["model_call_id"] == span_attributes["rollcap.model_call_id"]


def _big_directory(directory: Path, source: Capture, rollouts: int, calls: int) -> int:
    """``rollouts`` x ``calls`` copies of the real records, each with its own id."""
    store = CaptureStore(source.directory)
    [(_, template)] = store.read_available("2-0").records
    target = CaptureStore(directory)
    for r in range(rollouts):
        lines = [template | {"model_call_id": f"{r:04x}{i:028x}"} for i in range(calls)]
        target.append_many([(f"{r}-0", line) for line in lines])
    target.close()
    return rollouts * (calls + 1)


def test_many_spans_arrive_complete_in_bounded_chunks(
    capture: Capture, receiver: Receiver, tmp_path: Path
) -> None:
    total = _big_directory(tmp_path / "big", capture, rollouts=3, calls=400)
    result = export_otel(tmp_path / "big")
    assert result.ok
    assert (result.spans_sent, result.chunks_sent) == (total, 3)
    sizes = [len(list(r.resource_spans[0].scope_spans[0].spans)) for r in receiver.requests]
    assert sizes == [512, 512, total - 1024]
    assert len({s.span_id for s in receiver.spans()}) == total


def test_a_failed_chunk_exits_non_zero_saying_how_many_spans_were_lost(
    capture: Capture, receiver: Receiver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    total = _big_directory(tmp_path / "big", capture, rollouts=3, calls=400)
    receiver.answers = [200, 500]
    assert main(["capture", "export-otel", str(tmp_path / "big")]) == 1
    out, err = capsys.readouterr()
    assert f"sent {total - 512} of {total} spans" in out
    assert "1 of 3 chunks failed: 512 spans lost" in err
    assert receiver.statuses == [200, 500, 200]  # a 500 is not retried; the rest still go
    assert len(receiver.spans()) == total - 512


def test_a_503_is_retried_by_the_exporter(
    capture: Capture, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver.answers = [503]
    assert _export(capture) == 0
    assert receiver.statuses == [503, 200]
    assert "sent" in capsys.readouterr().out
    assert len(receiver.requests) == 1


def test_without_the_extra_it_is_a_one_line_error(
    capture: Capture,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # None in sys.modules makes the import fail, as if the package were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    monkeypatch.delitem(sys.modules, "rollcap.report._otel_sdk", raising=False)
    assert _export(capture) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert OTEL_INSTALL_HINT in err
    assert receiver.statuses == []
    assert not (capture.directory / RUN_KEY_FILE).exists()


def test_empty_directory_and_bad_input(
    tmp_path: Path, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["capture", "export-otel", str(tmp_path)]) == 0
    assert "nothing sent" in capsys.readouterr().err
    assert not (tmp_path / RUN_KEY_FILE).exists()

    assert main(["capture", "export-otel", str(tmp_path / "missing")]) == 1
    assert "no such capture directory" in capsys.readouterr().err

    store = CaptureStore(tmp_path)
    (tmp_path / RUN_KEY_FILE).write_text("not a uuid\n")
    store.append("0-0", {"model_call_id": "a" * 32, "dialect": "chat", "started_at": 1.5e9})
    assert main(["capture", "export-otel", str(tmp_path)]) == 2
    assert "does not hold a run key" in capsys.readouterr().err
    assert main(["capture", "export-otel", str(tmp_path), "--rollouts", "nope.jsonl"]) == 1
    assert receiver.statuses == []


def test_a_receiver_that_keeps_failing_is_given_up_on(
    capture: Capture, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver.answers = [500] * GIVE_UP_AFTER
    result = export_otel(capture.directory, max_spans_per_chunk=4)
    assert not result.ok
    assert receiver.statuses == [500] * GIVE_UP_AFTER  # nothing more was tried
    store = CaptureStore(capture.directory)
    total = sum(1 + len(store.read_available(r).records) for r in store.rollout_ids())
    assert result.chunks_failed == GIVE_UP_AFTER
    assert result.chunks_unsent == -(-total // 4) - GIVE_UP_AFTER > 0
    assert (result.spans_sent, result.spans_lost) == (0, total)
    _, err = format_export(result)
    assert f"more not sent after {GIVE_UP_AFTER} failures in a row" in err[-1]


def test_a_compacted_run_with_a_compressed_rollouts_file_exports_the_same_spans(
    capture: Capture, receiver: Receiver, tmp_path: Path
) -> None:
    from rollcap.store import compress_directory
    from rollcap.store._frames import encode_frame

    assert _export(capture, "--rollouts", str(capture.rollouts)) == 0
    plain_spans = sorted(
        plain(s)["rollcap.model_call_id"] for s in receiver.spans() if s.parent_span_id
    )
    receiver.requests.clear()
    packed = tmp_path / "packed"
    shutil.copytree(capture.directory, packed)
    assert compress_directory(packed).failed == []
    rollouts = tmp_path / "rollouts.jsonl.zst"
    rollouts.write_bytes(encode_frame(capture.rollouts.read_bytes()))
    assert rollouts.with_name("rollouts_failures.jsonl").is_file()  # its plain sidecar
    args = ["capture", "export-otel", str(packed), "--rollouts", str(rollouts), "--content", "ref"]
    assert main(args) == 0
    calls = [s for s in receiver.spans() if s.parent_span_id]
    assert sorted(plain(s)["rollcap.model_call_id"] for s in calls) == plain_spans
    files = {plain(s)["rollcap.capture.file"] for s in calls}
    assert files
    assert all(str(name).endswith(".capture.jsonl.zst") for name in files), files
