"""The corpus of collection's differential test: rollouts with their agent answers and capture
files, and the line collection made of each (``fixtures/differential``).

A case is one finished rollout as collection sees it: its ``Rollout``, the agent's checked
answer, the ``/run`` wall-clock, whether collection reads a capture, and the files of the
capture directory (by name, as bytes). The corpus holds:

- rollouts collected through the real stack (``environment``: the model server capturing in
  front of the fake upstream, the mcqa and calculator resources servers, their agents),
  recorded as they reached collection, with their capture files; some collected without a
  capture directory (the agent's evidence alone);
- calls sent straight to a capturing model server under a rollout prefix, every dialect,
  streamed and not, completing and failing scenarios, with answers written here (no evidence,
  a bundle joined by session, payloads redacted, a producer trajectory, an invalid bundle, a
  Claude Code compaction);
- capture files damaged or written by hand: torn and bad lines, blank lines, the incomplete
  marker with and without records, an empty or missing file, the compressed form alone or
  beside a plain one that agrees or disagrees, a repeated call id, a negative latency,
  foreign records.

``lines.jsonl`` holds, in the corpus's order, the line each case gave (``collection_line``)
when the corpus was built, byte for byte. They were made by the pipeline as it was before
collection stopped validating again the evidence it had built itself, read its capture
through its own store once, and left the encoding to its writer: the test holds the pipeline
to them. Rebuild both
files (only for a change that means to change the lines) with::

    .venv/bin/python -m tests.collect._differential
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from rollcap.collect import _runner, collect
from rollcap.collect._plan import Rollout
from rollcap.config import load_config
from rollcap.gym import example_data_path
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from rollcap.workflow import environment
from tests.evidence.conftest import bundle, gap, invocation, responses_raw
from tests.evidence.test_compaction import PERSISTED, messages_raw, turn_raw
from tests.server.conftest import (
    ROUTES,
    UPSTREAM_KEY,
    client_headers,
    model_server,
    request_body,
    settings_for,
)

__all__ = ["BLOBS", "CORPUS", "LINES", "Case", "collection_line", "load_cases", "materialize"]

FIXTURES = Path(__file__).parent / "fixtures" / "differential"
CORPUS = FIXTURES / "corpus.jsonl"
BLOBS = FIXTURES / "files.jsonl"  # the capture files' contents, each once, by digest
LINES = FIXTURES / "lines.jsonl"
_ITEMS = Path(__file__).parent.parent / "evidence" / "fixtures" / "conversation_items.json"


@dataclass(frozen=True)
class Case:
    name: str
    rollout: Rollout
    answer: dict[str, Any]
    latency_ms: float
    capture: bool  # collection reads the capture directory (else it has none)
    files: dict[str, bytes]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _case_json(case: Case) -> dict[str, Any]:
    return {
        "name": case.name,
        "task_index": case.rollout.task_index,
        "rollout_index": case.rollout.rollout_index,
        "attempt_index": case.rollout.attempt_index,
        "task": case.rollout.task,
        "answer": case.answer,
        "latency_ms": case.latency_ms,
        "capture": case.capture,
        "files": {name: _digest(data) for name, data in case.files.items()},
    }


def load_cases() -> list[Case]:
    blobs = {}
    for line in BLOBS.read_bytes().splitlines():
        digest, data = orjson.loads(line)
        blobs[digest] = base64.b64decode(data)
    cases = []
    for line in CORPUS.read_bytes().splitlines():
        value = orjson.loads(line)
        rollout = Rollout(
            value["task_index"], value["rollout_index"], value["attempt_index"], value["task"]
        )
        files = {name: blobs[digest] for name, digest in value["files"].items()}
        cases.append(
            Case(
                value["name"],
                rollout,
                value["answer"],
                value["latency_ms"],
                value["capture"],
                files,
            )
        )
    return cases


def materialize(case: Case, directory: Path) -> None:
    """Write the case's capture files into ``directory`` (made private, as a store makes it)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, data in case.files.items():
        (directory / name).write_bytes(data)


def collection_line(case: Case, directory: Path) -> bytes:
    """The line collection writes for the case, its capture files in ``directory``: built in
    its I/O thread through its own store, encoded by its writer."""
    store = CaptureStore(directory) if case.capture else None
    answer = copy.deepcopy(case.answer)
    return _runner._encoded(_runner._rollout_line(store, case.rollout, answer, case.latency_ms))


# -- building the corpus --

KEY = UPSTREAM_KEY


def _files_of(directory: Path, rollout_id: str) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for path in sorted(directory.iterdir())
        if path.name.split(".", 1)[0] == rollout_id
    }


@contextlib.contextmanager
def _recording() -> Iterator[list[tuple[Rollout, dict[str, Any], float]]]:
    """What reaches collection's line building, as it reaches it."""
    seen: list[tuple[Rollout, dict[str, Any], float]] = []
    original = _runner._rollout_line

    def spy(
        store: CaptureStore | None, rollout: Rollout, answer: Mapping[str, Any], latency_ms: float
    ) -> dict[str, Any]:
        seen.append((rollout, copy.deepcopy(dict(answer)), latency_ms))
        return original(store, rollout, answer, latency_ms)

    _runner._rollout_line = spy
    try:
        yield seen
    finally:
        _runner._rollout_line = original


def _tasks(resources_server: str, models: list[str | None], count: int) -> list[dict[str, Any]]:
    lines = example_data_path(resources_server).read_text().splitlines()[:count]
    tasks = []
    for n, line in enumerate(lines):
        task: dict[str, Any] = orjson.loads(line)
        model = models[n % len(models)]
        if model is not None:
            task["responses_create_params"] = {**task["responses_create_params"], "model": model}
        tasks.append(task)
    return tasks


async def _live_cases(work: Path) -> list[Case]:
    cases: list[Case] = []
    plans = [
        ("mcqa", "mcqa_simple_agent", [None, "choice-3", "reasoning", "incomplete"], 6),
        ("calculator", "simple_agent", ["tool_turns", "tool", None], 4),
    ]
    async with FakeUpstream(api_key=KEY) as upstream:
        for resources_server, agent, models, count in plans:
            capture_dir = work / f"live-{resources_server}"
            config = load_config(
                overrides=[
                    f"++policy_base_url={upstream.url}/v1",
                    f"++policy_api_key={KEY}",
                    "++observability_enabled=true",
                    f"++model_call_capture_dir={capture_dir}",
                ],
                env_file=None,
            )
            source = work / f"{resources_server}.jsonl"
            source.write_bytes(
                b"".join(orjson.dumps(t) + b"\n" for t in _tasks(resources_server, models, count))
            )
            async with environment(
                config, model_type="openai_model", resources_server=resources_server, head_port=0
            ) as env:
                url = env.url_of(agent)
                for capture in (True, False):
                    with _recording() as seen:
                        summary = await collect(
                            url,
                            source,
                            work / f"{resources_server}-{capture}.jsonl",
                            capture_dir=capture_dir if capture else None,
                            concurrency=4,
                        )
                    assert summary.failed == 0, summary
                    for rollout, answer, latency in seen:
                        rollout_id = rollout.rollout_id
                        files = _files_of(capture_dir, rollout_id) if capture else {}
                        tag = "capture" if capture else "evidence-only"
                        name = f"live-{resources_server}-{tag}-{rollout_id}"
                        cases.append(Case(name, rollout, answer, latency, capture, files))
    return cases


_ANSWER: dict[str, Any] = {"response": {"id": "resp_agent", "output": []}, "reward": 0.0}
_STREAMED = ("text", "tool", "reasoning", "incomplete", "stream_error", "truncate")
_NOT_STREAMED = ("text", "http_429", "http_500", "context_length", "malformed_json", "truncate")
_EVERY_DIALECT = ("plain", "session", "producer")


async def _direct_calls(work: Path) -> dict[str, dict[str, bytes]]:
    """Per dialect, a rollout's capture files: every scenario, streamed and not, each call sent
    with ``x-session-id: s-<dialect>``."""
    capture_dir = work / "direct"
    out: dict[str, dict[str, bytes]] = {}
    async with (
        FakeUpstream(api_key=KEY) as upstream,
        model_server(settings_for(upstream.url, capture_dir)) as openai_url,
        model_server(
            settings_for(upstream.url, capture_dir, model_type="anthropic_model")
        ) as anthropic_url,
        aiohttp.ClientSession() as session,
    ):
        for n, dialect in enumerate(("responses", "chat", "messages")):
            rollout_id = f"{100 + n}-0"
            base = anthropic_url if dialect == "messages" else openai_url
            url = f"{base}/ng-rollout/{rollout_id}{ROUTES[dialect]}"
            calls = [(s, True) for s in _STREAMED] + [(s, False) for s in _NOT_STREAMED]
            for scenario, stream in calls:
                headers = client_headers(dialect, scenario, **{"x-session-id": f"s-{dialect}"})
                body = request_body(dialect, stream=stream)
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.post(url, json=body, headers=headers) as response:
                        await response.read()
            out[dialect] = _files_of(capture_dir, rollout_id)
    return out


def _session_bundle(dialect: str, *, redacted: bool = False) -> dict[str, Any]:
    items = [item["sent"] for item in orjson.loads(_ITEMS.read_bytes())]
    tool = {
        "kind": "tool_call",
        "invocation_id": f"s-{dialect}",
        "tool_call_id": "c1",
        "tool_name": "lookup",
        "started_at": 1000.0,
        "completed_at": 1000.25,
        "duration_ms": 250.0,
        "timing_source": "executor",
        "status": "completed",
    }
    gaps = [gap("multimodal_history_redacted", None, f"s-{dialect}")] if redacted else []
    return bundle(
        invocation(f"s-{dialect}", status="completed", duration_ms=12.5, conversation=items),
        tool,
        gaps=gaps,
    )


def _first_ids(files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    lines = next(data for name, data in files.items() if name.endswith(".jsonl")).splitlines()
    return [orjson.loads(line) for line in lines if line.strip()]


def _producer(task_index: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """An agent's own trajectory naming the first two captured calls by their ids."""
    refs = [
        {"model_call_id": r["model_call_id"], "model_ref": r["model_ref"], "response_id": None}
        for r in records[:2]
    ]
    return {
        "schema_version": "1.0",
        "task_id": str(task_index),
        "rollout_id": f"{task_index}-0",
        "invocations": [invocation("root", *refs, status="completed")],
        "turns": [
            {
                "invocation_id": "root",
                "task_id": str(task_index),
                "rollout_id": f"{task_index}-0",
                "turn_no": 1,
                "timestamp": 1000.0,
                "question": "q",
                "answer": [{"type": "message", "role": "assistant", "content": "a"}],
                "model_calls": refs[:1],
            }
        ],
        "model_calls": [
            {
                "model_call_id": refs[0]["model_call_id"],
                "duration_ms": 3.5,
                "response_metadata": {"model": "agent-side"},
                "token_stats": {"prompt_tokens": 1},
            }
        ],
        "tool_calls": [],
        "gaps": [gap("resolution_unavailable", None, "root")],
    }


def _direct_cases(calls: dict[str, dict[str, bytes]]) -> list[Case]:
    cases: list[Case] = []
    for n, (dialect, files) in enumerate(calls.items()):
        task_index = 100 + n
        rollout = Rollout(task_index, 0, 0, {"question": f"direct {dialect}", "task_id": None})
        records = _first_ids(files)
        answers: dict[str, dict[str, Any]] = {
            "plain": dict(_ANSWER),
            "session": {**_ANSWER, "ng_agent_observations": _session_bundle(dialect)},
            "redacted": {
                **_ANSWER,
                "ng_agent_observations": _session_bundle(dialect, redacted=True),
            },
            "producer": {
                **_ANSWER,
                "resolved": True,
                "ng_agent_observations": _session_bundle(dialect),
                "ng_trajectory": _producer(task_index, records),
            },
            "invalid-bundle": {
                **_ANSWER,
                "ng_agent_observations": {"source": "x", "records": [{"kind": "nope"}]},
            },
            "invalid-producer": {**_ANSWER, "ng_trajectory": {"task_id": 3}},
        }
        for label, answer in answers.items():
            if dialect != "responses" and label not in _EVERY_DIALECT:
                continue  # what they pin does not depend on the dialect
            name = f"direct-{dialect}-{label}"
            cases.append(Case(name, rollout, answer, 42.125, True, files))
    return cases


def _raw_lines(*records: Mapping[str, Any]) -> bytes:
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


def _edge_cases(base: Case, work: Path) -> list[Case]:
    """Damaged and hand-written captures, each under its own rollout."""
    (plain_name,) = [name for name in base.files if name.endswith(".capture.jsonl")]
    plain = base.files[plain_name]
    first = plain.splitlines(keepends=True)[0]
    compressed = _compressed(plain, work)
    hand = [
        responses_raw(0, session="s"),
        responses_raw(1, session="s", latency_ms=None),
        responses_raw(2, response_id="resp_shared"),
    ]
    foreign: list[Any] = [
        {"model_call_id": "f" * 32, "dialect": "martian", "response": {"output": []}},
        {"model_call_id": 7, "started_at": "noon", "status_code": True, "gaps": [1, {"code": "x"}]},
        {"model_call_id": "e" * 32, "dialect": "chat", "response": {"choices": [{"message": {}}]}},
        {"dialect": "messages", "request": {"model": "m"}, "response": {"type": "message"}},
        {"model_call_id": "d" * 32, "response_source": "elsewhere", "upstream_attempted": 1},
        {"model_call_id": "c" * 32, "latency_ms": 1e308, "latency_ttft_ms": 0.004},
    ]
    variants: dict[str, dict[str, bytes]] = {
        "torn-last-line": {plain_name: plain + first[: len(first) // 2]},
        "bad-middle-line": {plain_name: first + b"not json\n[1, 2]\n" + plain},
        "blank-lines": {plain_name: b"\n  \n" + first + b"\n\n"},
        "incomplete-with-records": {plain_name: plain, "I.capture.incomplete": b""},
        "incomplete-only": {"I.capture.incomplete": b""},
        "empty-file": {plain_name: b""},
        "no-file": {},
        "compressed-only": {plain_name + ".zst": compressed},
        "compressed-and-plain-agree": {
            plain_name: plain + _raw_lines(responses_raw(9)),
            plain_name + ".zst": compressed,
        },
        "compressed-and-plain-disagree": {
            plain_name: _raw_lines(responses_raw(9)),
            plain_name + ".zst": compressed,
        },
        "repeated-call-id": {plain_name: first + first},
        "negative-latency": {
            plain_name: _raw_lines(responses_raw(0, latency_ms=-3.0), responses_raw(1))
        },
        "negative-ttft": {plain_name: _raw_lines(responses_raw(0, latency_ttft_ms=-0.5))},
        "hand-written": {plain_name: _raw_lines(*hand)},
        "foreign-records": {plain_name: _raw_lines(*foreign)},
        "compaction": {
            plain_name: _raw_lines(turn_raw(0), messages_raw(1), turn_raw(2)),
        },
    }
    cases = []
    for n, (label, files) in enumerate(variants.items()):
        rollout = replace(base.rollout, task_index=200 + n, rollout_index=0, attempt_index=0)
        rollout_id = rollout.rollout_id
        renamed = {rollout_id + name[name.index(".") :]: data for name, data in files.items()}
        answer = copy.deepcopy(base.answer)
        if label == "compaction":
            answer["ng_agent_observations"] = _claude_bundle()
            answer.pop("ng_trajectory", None)
        elif label == "hand-written":
            answer["ng_agent_observations"] = bundle(
                invocation("s", {"response_id": "resp_shared", "model_ref": hand[2]["model_ref"]})
            )
            answer.pop("ng_trajectory", None)
        cases.append(Case(f"edge-{label}", rollout, answer, base.latency_ms, True, renamed))
    # The same capture with the agent's evidence in every way collection can meet it.
    rollout = replace(base.rollout, task_index=300, rollout_index=1, attempt_index=2)
    files = {rollout.rollout_id + ".capture.jsonl": plain}
    for label, change in (
        ("no-evidence", ("ng_agent_observations", "ng_trajectory")),
        ("observations-only", ("ng_trajectory",)),
        ("trajectory-only", ("ng_agent_observations",)),
    ):
        answer = {k: v for k, v in base.answer.items() if k not in change}
        cases.append(Case(f"edge-{label}", rollout, answer, 0.0, True, files))
    return cases


def _claude_bundle() -> dict[str, Any]:
    def by_response(n: int) -> dict[str, Any]:
        return {
            "model_ref": {"type": "responses_api_models", "name": "policy_model"},
            "response_id": f"resp_{n}",
        }

    return {
        "source": "claude_code",
        "records": [
            invocation("s", by_response(0), by_response(2)),
            {
                "kind": "context_compaction",
                "invocation_id": "s",
                "outcome": "completed",
                "summary": PERSISTED,
                "before_model_call": by_response(0),
                "after_model_call": by_response(2),
            },
        ],
        "gaps": [gap("compaction_model_call_reference_unavailable", None, "s")],
    }


def _compressed(plain: bytes, work: Path) -> bytes:
    """``plain`` as the store compacts it."""
    directory = work / "compact"
    directory.mkdir(exist_ok=True)
    (directory / "0-0.capture.jsonl").write_bytes(plain)
    store = CaptureStore(directory)
    assert store.compact("0-0")
    return (directory / "0-0.capture.jsonl.zst").read_bytes()


@contextlib.asynccontextmanager
async def _work() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rollcap-differential-") as work:
        yield Path(work)


async def _build() -> list[Case]:
    async with _work() as work:
        cases = await _live_cases(work)
        cases += _direct_cases(await _direct_calls(work))
        base = next(c for c in cases if c.name.startswith("live-mcqa-capture"))
        cases += _edge_cases(base, work)
    return cases


def main() -> None:
    cases = asyncio.run(_build())
    names = [case.name for case in cases]
    assert len(set(names)) == len(names), "case names repeat"
    FIXTURES.mkdir(parents=True, exist_ok=True)
    lines = []
    with tempfile.TemporaryDirectory(prefix="rollcap-differential-lines-") as work:
        for n, case in enumerate(cases):
            directory = Path(work) / str(n)
            materialize(case, directory)
            lines.append(collection_line(case, directory))
    blobs = {_digest(data): data for case in cases for data in case.files.values()}
    BLOBS.write_bytes(
        b"".join(
            orjson.dumps([digest, base64.b64encode(data).decode()]) + b"\n"
            for digest, data in sorted(blobs.items())
        )
    )
    CORPUS.write_bytes(b"".join(orjson.dumps(_case_json(case)) + b"\n" for case in cases))
    LINES.write_bytes(b"".join(lines))
    print(f"{len(cases)} cases in {os.path.relpath(CORPUS)}, their lines in {LINES.name}")


if __name__ == "__main__":
    main()
