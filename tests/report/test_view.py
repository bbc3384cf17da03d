"""``rollcap capture view``'s app over a real socket: the page, the API, and a run that grows."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.report import VIEW_CSP, create_view_app, find_run
from rollcap.report import _view as view_module
from rollcap.report._source import read_rollout
from rollcap.report._view import RunIndex, host_name
from rollcap.status import (
    HeadStatus,
    LiveStatusSettings,
    RunBoard,
    ServerAnswer,
    StatusSource,
    status_path,
)
from rollcap.store import CaptureStore
from tests.report._evaluation import EXPECTED_CALLS, STREAMED

STARTED_AT = 1_700_000_000.0


@pytest.fixture
async def served(job_copy: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    app = create_view_app(find_run(job_copy, staging=job_copy / "staging"))
    async with serving(app) as url, aiohttp.ClientSession() as session:
        yield url, session


async def get(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, Any]:
    async with session.get(url, **kwargs) as response:
        body = await response.read()
        if response.content_type == "application/json":
            return response.status, orjson.loads(body)
        return response.status, body.decode()


async def test_the_page_asks_the_api(served: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = served
    status, page = await get(session, url + "/")
    assert status == 200
    assert f'content="{VIEW_CSP}"' in page
    data = re.search(r'id="rollcap-data">(.*?)</script>', page)
    assert data is not None
    assert orjson.loads(data.group(1)) == {"mode": "served", "live": False}


async def test_summary_rollout_raw_and_tokens(served: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = served
    async with session.get(url + "/api/summary") as response:
        summary = await response.json()
        assert response.headers["etag"] == f'"{summary["revision"]}"'
        assert response.headers["cache-control"] == "no-store"
    assert summary["rollouts"]["id"] == list(EXPECTED_CALLS)
    assert summary["rollouts"]["calls"] == list(EXPECTED_CALLS.values())
    status, payload = await get(session, url + "/api/rollout/0-1")
    assert status == 200
    assert len(payload["calls"]) == EXPECTED_CALLS["0-1"]
    streamed = STREAMED["0-1"].index(1)
    status, raw = await get(session, f"{url}/api/rollout/0-1/call/{streamed}/raw")
    assert status == 200
    assert raw["response_raw"].startswith("data: ")
    assert await get(session, f"{url}/api/rollout/0-1/call/0/raw") == (200, {})
    status, tokens = await get(session, url + "/api/rollout/3-0/tokens")
    assert status == 200
    assert tokens["error"] is None
    assert tokens["verdict"]["trainable"]  # the gate's ledger, found in the capture directory
    assert len(tokens["chains"]) == 1
    assert set(tokens["chains"][0]["mask"]) == {0.0, 1.0}
    assert await get(session, url + "/api/rollout/0-0/tokens") == (200, None)


async def test_ids_from_the_url_are_validated(served: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = served
    for bad in ("a%24b", ".hidden", "a" * 201):
        status, body = await get(session, f"{url}/api/rollout/{bad}")
        assert status == 400, bad
        assert "Invalid rollout id" in body["error"]
    status, body = await get(session, f"{url}/api/rollout/..%2F..%2Fetc/call/0/raw")
    assert status == 404  # a slash never reaches the id
    assert (await get(session, url + "/api/rollout/7-7"))[0] == 404
    assert (await get(session, url + "/api/rollout/0-0/call/99/raw"))[0] == 404


async def test_only_loopback_host_names_are_answered(
    served: tuple[str, aiohttp.ClientSession],
) -> None:
    url, session = served
    status, _ = await get(session, url + "/api/summary", headers={"Host": "evil.example"})
    assert status == 400
    port = url.rsplit(":", 1)[1]
    for name in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
        status, _ = await get(session, url + "/api/summary", headers={"Host": name})
        assert status == 200, name


def test_host_names_lose_their_port_but_not_their_brackets() -> None:
    assert host_name("LocalHost:8080") == "localhost"
    assert host_name("[::1]:8080") == "[::1]"
    assert host_name("[::1]") == "[::1]"
    assert host_name("") == ""


async def test_a_rollout_that_lands_shows_in_the_next_summary(
    served: tuple[str, aiohttp.ClientSession], job_copy: Path
) -> None:
    url, session = served
    _, before = await get(session, url + "/api/summary")
    _, again = await get(session, url + "/api/summary")
    assert again["revision"] == before["revision"]
    store = CaptureStore(job_copy / "model-calls")
    store.append("4-0", store.read("0-0")[0])
    _, after = await get(session, url + "/api/summary")
    assert after["revision"] != before["revision"]
    assert after["rollouts"]["id"] == [*EXPECTED_CALLS, "4-0"]
    assert after["run"]["calls"] == before["run"]["calls"] + 1


def test_the_index_reads_only_files_that_changed_and_keeps_no_payload(
    job_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = read_rollout

    def counting(store: CaptureStore, rollout_id: str, line: Any) -> Any:
        reads.append(rollout_id)
        return real(store, rollout_id, line)

    monkeypatch.setattr(view_module, "read_rollout", counting)
    index = RunIndex(find_run(job_copy))
    first, _ = index.summary()
    assert sorted(reads) == sorted(EXPECTED_CALLS)
    reads.clear()
    assert index.summary()[0] == first
    assert reads == []
    store = CaptureStore(job_copy / "model-calls")
    store.append("0-1", store.read("0-1")[0])
    assert index.summary()[0] != first
    assert reads == ["0-1"]
    assert all(digest.payload is None for _, digest in index._digests.values())
    index.close()


def test_the_index_follows_a_capture_into_its_compacted_file(job_copy: Path) -> None:
    index = RunIndex(find_run(job_copy))
    first, _ = index.summary()
    store = CaptureStore(job_copy / "model-calls")
    assert store.compact("0-1")
    compacted, _ = index.summary()
    assert compacted != first
    # Appends after a compaction go to the compressed file: the index sees them there.
    store.append("0-1", store.read("0-1")[0])
    assert index.summary()[0] != compacted
    # A rollout with no line and only a compressed capture is still the run's.
    store.append("4-0", store.read("0-0")[0])
    assert store.compact("4-0")
    payload = index.payload("4-0")
    assert payload is not None
    assert len(payload["calls"]) == 1
    index.close()


async def test_search_and_divergence_are_asked_of_the_server(
    served: tuple[str, aiohttp.ClientSession],
) -> None:
    url, session = served
    status, found = await get(session, url + "/api/search", params={"q": "Are you SURE"})
    assert (status, found) == (200, {"q": "Are you SURE", "ids": ["0-0"]})
    status, found = await get(session, url + "/api/search", params={"q": "capital france"})
    assert sorted(found["ids"]) == ["0-0", "0-1", "1-0", "3-0"]  # the lines' task (not 2-0's)
    status, everything = await get(session, url + "/api/search")
    assert everything["ids"] == list(EXPECTED_CALLS)
    status, why = await get(session, url + "/api/diverge/0-0/0-1")
    assert status == 200
    assert (why["kind"], why["a"], why["b"], why["role_a"]) == ("message", 2, 2, "user")
    status, same = await get(session, url + "/api/diverge/0-0/0-0")
    assert (status, same) == (200, None)
    status, error = await get(session, url + "/api/diverge/0-0/9-9")
    assert status == 404
    assert error == {"error": "no rollout 0-0 or 9-9"}
    status, error = await get(session, url + "/api/diverge/0-0/..%2Fx")
    assert status in (400, 404)


# --- the live panel's status: GET /api/live ---------------------------------------------------


def stalled_board(run_id: str = "rollouts.jsonl") -> RunBoard:
    """A run of three rollouts at 80 s: ``0-0`` done, ``1-0`` stalled in a model call on
    ``policy`` (whose upstream has been silent for 75 s), ``4-0`` (no capture yet) between
    calls for 10 s; and a model server, ``judge``, that did not answer."""
    board = RunBoard(
        LiveStatusSettings(),
        run_id=run_id,
        agent="calculator_agent",
        planned=3,
        skipped=0,
        started=0.0,
        started_at=STARTED_AT,
    )
    board.start("0-0", task_index=0, rollout_index=0, attempt=1, redispatched=False, now=0.0)
    board.start("1-0", task_index=1, rollout_index=0, attempt=1, redispatched=False, now=1.0)
    board.end("0-0", "ok", 4.0)
    board.start("4-0", task_index=4, rollout_index=0, attempt=2, redispatched=False, now=70.0)
    call = {
        "rollout_id": "1-0",
        "dialect": "chat_completions",
        "state": "stalled",
        "phase": "waiting_upstream",
        "started_at": STARTED_AT + 5.0,
        "age_ms": 75_000,
        "upstream_silence_ms": 75_000,
    }
    board.observe(
        [
            ServerAnswer(
                "policy",
                "http://127.0.0.1:1",
                rollouts={
                    "1-0": {
                        "calls_ended": 2,
                        "calls_failed": 0,
                        "last_call_ended_ms_ago": 75_000,
                        "last_call_cancelled": False,
                        "open_calls": [call],
                    }
                },
            ),
            ServerAnswer("judge", "http://127.0.0.1:2", error="timed out after 2 s"),
        ],
        now=80.0,
    )
    return board


def finish(board: RunBoard) -> None:
    """The stalled rollout fails, the other one ends, and the run is over."""
    board.end("1-0", "failed", 90.0)
    board.end("4-0", "ok", 95.0)
    board.finished = True


def write_status(path: Path, board: RunBoard, now: float) -> dict[str, Any]:
    """The board's document at ``now``, put in place as the collector does (a rename)."""
    document = board.document(now, time.time())
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(orjson.dumps(document))
    partial.replace(path)
    return document


async def test_the_live_status_is_read_from_the_status_file(job_copy: Path, tmp_path: Path) -> None:
    path = status_path(tmp_path / "rollouts.jsonl")
    board = stalled_board()
    document = write_status(path, board, 80.0)
    app = create_view_app(find_run(job_copy), live=StatusSource(path=path))
    async with serving(app) as url, aiohttp.ClientSession() as session:
        _, page = await get(session, url + "/")
        data = re.search(r'id="rollcap-data">(.*?)</script>', page)
        assert data is not None
        assert orjson.loads(data.group(1)) == {"mode": "served", "live": True}
        async with session.get(url + "/api/live") as response:
            assert response.status == 200
            assert response.headers["cache-control"] == "no-store"
            answer = await response.json()
        assert answer == {"source": str(path), "runs": [document], "error": None}
        (run,) = answer["runs"]
        assert run["run"]["finished"] is False
        assert run["states"]["stalled"] == 1
        assert [s["ok"] for s in run["servers"]] == [True, False]
        stalled, idle = run["rollouts"]  # the one that needs a look first
        assert (stalled["rollout_id"], stalled["state"]) == ("1-0", "stalled")
        assert stalled["doing"]["kind"] == "model_call"
        assert (stalled["doing"]["server"], stalled["doing"]["phase"]) == (
            "policy",
            "waiting_upstream",
        )
        assert (idle["rollout_id"], idle["state"]) == ("4-0", "active")
        assert idle["doing"] == {"kind": "between_calls", "for_s": 10.0}
        # The file is read again on each request: the collector replaces it as the run goes.
        finish(board)
        write_status(path, board, 95.0)
        _, answer = await get(session, url + "/api/live")
        assert answer["error"] is None
        assert answer["runs"][0]["run"]["finished"] is True
        assert answer["runs"][0]["counts"]["done"] == 3
        assert answer["runs"][0]["rollouts"] == []


async def test_a_missing_or_unreadable_status_file_is_an_error_in_the_answer(
    job_copy: Path, tmp_path: Path
) -> None:
    path = tmp_path / "rollouts_status.json"
    app = create_view_app(find_run(job_copy), live=StatusSource(path=path))
    async with serving(app) as url, aiohttp.ClientSession() as session:
        status, answer = await get(session, url + "/api/live")
        assert status == 200
        assert answer == {
            "source": str(path),
            "runs": [],
            "error": f"{path}: no status file (yet)",
        }
        path.write_text("{half a docu")
        status, answer = await get(session, url + "/api/live")
        assert status == 200
        assert answer["runs"] == []
        assert answer["error"].startswith(f"{path}: not a status document")


async def test_without_a_live_source_there_is_no_live_status(
    served: tuple[str, aiohttp.ClientSession],
) -> None:
    url, session = served
    status, answer = await get(session, url + "/api/live")
    assert status == 404
    assert answer == {"error": "this view was started without a live status source"}


async def test_the_live_status_is_asked_of_a_head_server(job_copy: Path) -> None:
    head = HeadStatus()
    first, second = stalled_board("a.jsonl"), stalled_board("b.jsonl")
    finish(second)
    head.put(orjson.dumps(first.document(80.0, STARTED_AT + 80.0)))
    head.put(orjson.dumps(second.document(95.0, STARTED_AT + 95.0)))

    async def status(request: Request) -> Response:
        return Response(head.body(), media_type="application/json")

    head_app = Starlette(routes=[Route("/status", status)])
    async with serving(head_app) as head_url, aiohttp.ClientSession() as session:
        app = create_view_app(find_run(job_copy), live=StatusSource(head_url=head_url))
        async with serving(app) as url:
            _, answer = await get(session, url + "/api/live")
        assert answer["source"] == head_url + "/status"
        assert answer["error"] is None
        # The most recently told first.
        assert [run["run"]["id"] for run in answer["runs"]] == ["b.jsonl", "a.jsonl"]
        assert [run["run"]["finished"] for run in answer["runs"]] == [True, False]
