"""``attach`` over real capture directories written with ``CaptureStore``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap import read_model_call_records
from rollcap._runtime.serving import serving
from rollcap.collect import collect
from rollcap.evidence import (
    AgentObservationBundle,
    TrajectoryRecord,
    attach,
    build_ng_perf,
    read_capture,
)
from rollcap.routing import base_url_for_run
from rollcap.server import create_model_app
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.evidence.conftest import (
    bundle,
    by_id,
    call_id,
    canonical,
    gap,
    invocation,
    responses_raw,
)
from tests.server.conftest import settings_for

FIXTURES = Path(__file__).parent / "fixtures"
ROW = {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": 0, "question": "q"}
ANSWER = {"response": {"id": "resp_agent", "output": []}, "reward": 0.5}


def on(
    tmp_path: Path, answer: dict[str, Any] = ANSWER, row: dict[str, Any] = ROW
) -> dict[str, Any]:
    return attach(
        row, answer, capture_dirs=[tmp_path], observability_enabled=True, rollout_latency_ms=10.0
    )


def capture_gaps(line: dict[str, Any]) -> list[dict[str, Any]]:
    gaps: list[dict[str, Any]] = line["ng_model_call_capture"].get("gaps", [])
    return gaps


def test_no_store_is_no_records(tmp_path: Path) -> None:
    line = on(tmp_path)
    assert capture_gaps(line) == [{"code": "model_call_capture_no_records"}]
    assert line["ng_trajectory"]["gaps"] == [
        gap("model_call_capture_no_records"),
        gap("model_calls_unavailable"),
        gap("turns_unavailable"),
        gap("conversation_unavailable"),
    ]
    assert "ng_perf" not in line  # no invocation


def test_an_empty_file_is_no_records(tmp_path: Path) -> None:
    CaptureStore(tmp_path).reset("0-0")
    assert capture_gaps(on(tmp_path)) == [{"code": "model_call_capture_no_records"}]


def test_a_marker_only_capture_is_incomplete(tmp_path: Path) -> None:
    CaptureStore(tmp_path).mark_incomplete("0-0")
    assert capture_gaps(on(tmp_path)) == [{"code": "model_call_capture_incomplete"}]


def test_bad_lines_are_counted_and_the_rest_read(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", responses_raw(0))
    with store.path_for("0-0").open("ab") as handle:
        handle.write(b"[1]\n\n{torn\n")
    store.append("0-0", responses_raw(1))
    line = on(tmp_path)
    assert capture_gaps(line) == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"}
    ]
    assert [c["call_index"] for c in line["ng_model_call_capture"]["calls"]] == [0, 3]
    store.mark_incomplete("0-0")
    assert capture_gaps(on(tmp_path)) == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=2"},
        {"code": "model_call_capture_incomplete"},
    ]


def test_only_bad_lines_is_records_unreadable_alone(tmp_path: Path) -> None:
    CaptureStore(tmp_path).path_for("0-0").write_bytes(b"nope\n")
    assert capture_gaps(on(tmp_path)) == [
        {"code": "model_call_capture_records_unreadable", "detail": "count=1"}
    ]


def test_an_unreadable_file_is_unreadable_without_detail(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.path_for("0-0").mkdir()  # exists, and reading it fails (IsADirectoryError)
    store.mark_incomplete("0-0")
    line = on(tmp_path)
    assert capture_gaps(line) == [
        {"code": "model_call_capture_unreadable"},
        {"code": "model_call_capture_incomplete"},
    ]
    assert line["ng_model_call_capture"]["calls"] == []


def test_the_first_directory_with_the_rollout_wins(tmp_path: Path) -> None:
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    CaptureStore(second).mark_incomplete("0-0")
    CaptureStore(third).append("0-0", responses_raw(0))
    read = read_capture([first, second, third], "0-0")
    assert (read.store_found, read.incomplete, read.calls) == (True, True, ())
    assert [c.model_call_id for c in read_capture([first, third], "0-0").calls] == [call_id(0)]
    assert read_capture([first], "0-0").store_found is False
    assert not first.exists()  # looking creates nothing


def test_the_join_through_attach(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", responses_raw(0, session="root"))
    store.append("0-0", responses_raw(1))
    store.append("0-0", responses_raw(2))
    answer = {
        **ANSWER,
        "ng_agent_observations": bundle(
            invocation("root", conversation=[{"role": "user", "content": "q"}]),
            invocation("sub", by_id(1), by_id(7)),
        ),
    }
    line = on(tmp_path, answer)
    joined = line["ng_agent_observations"]
    assert joined["records"][0]["model_calls"] == [canonical(0)]
    assert joined["records"][1]["model_calls"][0] == canonical(1)
    assert joined["gaps"] == [
        gap("model_call_reference_unmatched", call_id(7), "sub"),
        gap("model_call_ownership_unavailable", f"capture:{call_id(2)}:call_index=2"),
    ]
    assert line["ng_trajectory"]["gaps"] == joined["gaps"]
    assert [t["invocation_id"] for t in line["ng_trajectory"]["turns"]] == ["root", "sub"]
    assert line["ng_perf"]["num_turns"] == 2
    assert line["ng_perf"]["total_latency_ms"] == 10.0


def test_observability_off_builds_the_trajectory_from_the_agents_evidence_alone(
    tmp_path: Path,
) -> None:
    CaptureStore(tmp_path).append("0-0", responses_raw(0))
    observations = bundle(invocation("root", by_id(0)))
    answer = {**ANSWER, "ng_agent_observations": observations}
    line = attach(
        ROW, answer, capture_dirs=[tmp_path], observability_enabled=False, rollout_latency_ms=5.0
    )
    assert line["ng_agent_observations"] is observations  # passed through, unjoined
    assert "ng_model_call_capture" not in line
    assert "ng_perf" not in line
    assert line["ng_trajectory"]["invocations"][0]["model_calls"] == [
        {"model_call_id": call_id(0), "model_ref": None, "response_id": None}
    ]
    # Without any evidence key, no trajectory at all.
    assert "ng_trajectory" not in attach(ROW, ANSWER, observability_enabled=False)


def test_the_agents_evidence_is_validated_once_and_what_attach_built_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", responses_raw(0, session="root"))
    answer = {
        **ANSWER,
        "ng_agent_observations": bundle(
            invocation("root", conversation=[{"role": "user", "content": "q"}])
        ),
        "ng_trajectory": {"task_id": "0", "rollout_id": "0-0"},
    }
    validated: list[str] = []
    for model in (AgentObservationBundle, TrajectoryRecord):
        original = model.model_validate

        def counting(cls: type[Any], value: Any, _original: Any = original) -> Any:
            validated.append(cls.__name__)
            return _original(value)

        monkeypatch.setattr(model, "model_validate", classmethod(counting))
    copied: list[bool] = []
    original_copy = AgentObservationBundle.model_copy

    def copy_counted(self: AgentObservationBundle, **kwargs: Any) -> AgentObservationBundle:
        copied.append(True)
        return original_copy(self, **kwargs)

    monkeypatch.setattr(AgentObservationBundle, "model_copy", copy_counted)
    line = attach(
        ROW, answer, capture_dirs=[store], observability_enabled=True, rollout_latency_ms=1.0
    )
    # The agent's bundle and its trajectory, once each; the joined bundle, the trajectory
    # built from it and ng_perf's reading of it are the pipeline's own.
    assert validated == ["AgentObservationBundle", "TrajectoryRecord"]
    assert copied == []
    assert line["ng_agent_observations"]["records"][0]["model_calls"] == [canonical(0)]
    assert line["ng_perf"]["num_turns"] == 1
    # The control: the same counters see a validation of the line's own dump.
    assert build_ng_perf(line, 1.0) == line["ng_perf"]
    assert validated[-1] == "TrajectoryRecord"


def test_a_redaction_gap_keeps_payloads_out_of_the_line(tmp_path: Path) -> None:
    CaptureStore(tmp_path).append("0-0", responses_raw(0, session="root"))
    answer = {
        **ANSWER,
        "ng_agent_observations": bundle(
            invocation("root"), gaps=[{"code": "multimodal_history_redacted"}]
        ),
    }
    line = on(tmp_path, answer)
    assert not set(line["ng_model_call_capture"]["calls"][0]) & {"request", "response"}
    call = line["ng_trajectory"]["model_calls"][0]
    assert (call["request"], call["response"]) == (None, None)
    assert line["ng_trajectory"]["turns"] == []
    assert gap("multimodal_history_redacted") in line["ng_trajectory"]["gaps"]
    # The capture file keeps them.
    assert CaptureStore(tmp_path).read("0-0")[0]["request"] == responses_raw(0)["request"]


def test_identity_keys_are_copied_and_the_answer_is_left_alone(tmp_path: Path) -> None:
    row = {**ROW, "_ng_attempt_index": 2, "agent_ref": {"name": "a"}, "_ng_rollout_id": "run"}
    answer = {**ANSWER, "_ng_task_index": "agent's", "extra": 1, "ng_trajectory": {"bad": True}}
    before = copy.deepcopy(answer)
    CaptureStore(tmp_path).append("run-a2", responses_raw(0))
    line = on(tmp_path, answer, row)
    assert answer == before
    assert list(line)[:5] == ["response", "reward", "_ng_task_index", "extra", "ng_trajectory"]
    assert line["_ng_task_index"] == 0
    assert (line["_ng_attempt_index"], line["agent_ref"], line["_ng_rollout_id"]) == (
        2,
        {"name": "a"},
        "run",
    )
    assert line["ng_model_call_capture"]["rollout_id"] == "run-a2"
    assert (line["response"], line["reward"]) == (ANSWER["response"], ANSWER["reward"])
    assert line["ng_trajectory"]["gaps"][0] == gap("producer_trajectory_invalid", "ValidationError")


def test_a_rollout_id_that_names_no_file_gets_no_attachment(tmp_path: Path) -> None:
    line = on(tmp_path, row={**ROW, "_ng_rollout_id": "../escape"})
    assert "ng_model_call_capture" not in line
    assert "ng_trajectory" not in line


def test_a_projection_failure_through_attach(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", responses_raw(0, latency_ms=-3.0))
    line = on(tmp_path)
    assert "ng_trajectory" not in line
    assert "ng_perf" not in line
    assert capture_gaps(line) == [
        {"code": "trajectory_projection_failed", "detail": "ValidationError"}
    ]
    assert line["ng_model_call_capture"]["calls"][0]["request"] == responses_raw(0)["request"]


def test_golden_rollout_byte_for_byte(tmp_path: Path) -> None:
    case = json.loads((FIXTURES / "golden_rollout.json").read_text())
    store = CaptureStore(tmp_path)
    for raw in case["capture"]:
        store.append(case["rollout_id"], raw)
    if case["incomplete"]:
        store.mark_incomplete(case["rollout_id"])
    line = attach(
        case["row"],
        case["answer"],
        capture_dirs=[tmp_path],
        observability_enabled=True,
        rollout_latency_ms=case["rollout_latency_ms"],
    )
    assert line == case["line"]
    expected = (FIXTURES / "golden_rollout.line.jsonl").read_bytes()
    assert orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE) == expected


@pytest.mark.parametrize("enabled", [True, False])
def test_attach_never_raises_for_junk_evidence(tmp_path: Path, enabled: bool) -> None:
    CaptureStore(tmp_path).append("0-0", {"model_call_id": 5, "response": [1]})
    junks: tuple[object, ...] = (1, "x", [], {"records": 3}, None)
    for junk in junks:
        answer = {
            **ANSWER,
            "ng_agent_observations": junk,
            "ng_trajectory": junk,
            "ng_model_call_capture": junk,
        }
        line = attach(ROW, answer, capture_dirs=[tmp_path], observability_enabled=enabled)
        assert (line["response"], line["reward"]) == (ANSWER["response"], ANSWER["reward"])
        assert "ng_trajectory" in line


async def test_an_external_harness_joins_by_session_id_through_the_model_server(
    tmp_path: Path,
) -> None:
    """A harness of its own: the OpenAI SDK through the rollout prefix with ``x-session-id``
    naming its invocation, and a bundle that lists no call. Collection joins them exactly."""
    capture = tmp_path / "calls"

    async def run(request: Request) -> Response:
        body = orjson.loads(await request.body())
        invocation_id = f"harness-{body['_ng_task_index']}"
        async with httpx2.AsyncClient() as http:
            client = openai.AsyncOpenAI(
                base_url=base_url_for_run(model_url, body) + "/v1",
                api_key="unused",
                default_headers={"x-session-id": invocation_id},
                max_retries=0,
                http_client=http,
            )
            first = await client.responses.create(model="fake-model", input=body["question"])
            await client.responses.create(model="fake-model", input=first.output_text)
        observations = {
            "source": "harness",
            "records": [
                {"kind": "agent_invocation", "invocation_id": invocation_id, "status": "completed"}
            ],
        }
        answer = {
            "response": first.model_dump(mode="json"),
            "reward": 1.0,
            "ng_agent_observations": observations,
        }
        return Response(orjson.dumps(answer), media_type="application/json")

    harness = Starlette(routes=[Route("/run", run, methods=["POST"])])
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"question": "one?"}\n{"question": "two?"}\n')
    async with (
        FakeUpstream() as upstream,
        serving(create_model_app(settings_for(upstream.url, capture, api_key=None))) as model_url,
        serving(harness) as harness_url,
    ):
        summary = await collect(harness_url, source, tmp_path / "out.jsonl", capture_dir=capture)
    lines = [orjson.loads(raw) for raw in summary.output_path.read_bytes().splitlines()]
    assert len(lines) == 2
    for task, line in enumerate(lines):
        calls = read_model_call_records(CaptureStore(capture), f"{task}-0")
        assert [c.client_session_id for c in calls] == [f"harness-{task}"] * 2
        (root,) = line["ng_agent_observations"]["records"]
        assert root["model_calls"] == [
            {
                "model_call_id": c.model_call_id,
                "model_ref": {"type": "responses_api_models", "name": "policy_model"},
                "response_id": c.response_id,
            }
            for c in calls
        ]
        assert line["ng_agent_observations"]["gaps"] == []
        assert [t["turn_no"] for t in line["ng_trajectory"]["turns"]] == [1, 2]
        assert line["ng_perf"]["num_turns"] == 2
        assert line["ng_perf"]["token_observability_coverage"] == 1.0
