"""``rollcap capture view``'s app over a real socket: the page, the API, and a run that grows."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap._runtime.serving import serving
from rollcap.report import VIEW_CSP, create_view_app, find_run
from rollcap.report import _view as view_module
from rollcap.report._source import read_rollout
from rollcap.report._view import RunIndex, host_name
from rollcap.store import CaptureStore
from tests.report._evaluation import EXPECTED_CALLS, STREAMED


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
    assert orjson.loads(data.group(1)) == {"mode": "served"}


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
