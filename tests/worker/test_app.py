"""The capture worker over real sockets, in front of the fake upstream (or a stub engine)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import openai
import orjson
import pytest
from aiohttp import web

from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    EMPTY_EXTRAS_DIGEST,
    PREFIX_IDS_FIELD,
    CommitCoords,
    DirectoryStagingSink,
    compute_chain_hash,
    compute_extras_digest,
    hash_token_ids,
)
from rollcap.testing import (
    FakeUpstream,
    assistant_body,
    encode,
    expected_response,
    fake_logprob,
    render_prompt,
)
from rollcap.worker import create_worker_app
from tests.conftest import SECRETS
from tests.worker.conftest import (
    CHAT,
    CLIENT_KEY,
    FIRST_QUESTION,
    UPSTREAM_KEY,
    Reply,
    Worker,
    chat_body,
    child_admission,
    free_port,
    rebuild,
    record_json,
    root_admission,
    settings_for,
    staged_files,
    stub_upstream,
    vllm_answer,
    worker_at,
)

END = 2
TOKEN_FIELDS = ("return_token_ids", "logprobs", "return_tokens_as_token_ids")


def _generated(answer: dict[str, Any]) -> list[int]:
    """The ids the fake generates for an answer: its body's bytes, then the end of message."""
    return [*encode(assistant_body(answer["choices"][0]["message"])), END]


def _assistant(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer sent back as the next turn's assistant message."""
    return {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}


def _assert_failed_shape(coords: CommitCoords, admission: dict[str, Any], version: int) -> None:
    """STAGING §4.1's ``capture_failed`` coords of this admission."""
    assert coords.model_dump(mode="json") == {
        "schema_version": 2,
        "digest_version": 2,
        "extras_digest_version": 1,
        "rollout_id": admission["rollout_id"],
        "model_call_id": admission["model_call_id"],
        "parent_call_id": admission["parent_call_id"],
        "prev_len": admission["prev_len"],
        "delta_len": 0,
        "cum_len": admission["prev_len"],
        "weight_version": version,
        "disposition": "capture_failed",
        "digest": None,
        "extras_digest": None,
        "staging_key": None,
        "chain_hash": None,
        "cumulative_hash": None,
    }


# -- staging -----------------------------------------------------------------------------------


async def test_a_root_call_is_staged_as_the_engine_said(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=root_admission("a1")))

    assert reply.status == 200, reply.body
    (sent,) = upstream.requests
    assert CAPTURE_FIELD not in sent.json
    assert all(sent.json[name] is True for name in TOKEN_FIELDS)
    assert PREFIX_IDS_FIELD not in sent.json
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    # The answer is the engine's, token fields included, plus the coords.
    answer = reply.answer
    assert answer == expected_response("chat", sent.json, {"x-fake-scenario": "text"})
    prompt = render_prompt([{"role": "user", "content": FIRST_QUESTION}])
    generated = _generated(answer)
    assert answer["prompt_token_ids"] == prompt
    logprobs = [fake_logprob(t, i) for i, t in enumerate(generated)]

    record = record_json(worker.staging_dir, "r-0", "a1")
    assert record["token_ids_delta"] == prompt + generated
    assert record["token_mask_delta"] == [0.0] * len(prompt) + [1.0] * len(generated)
    assert all(type(m) is float for m in record["token_mask_delta"])
    assert record["generation_log_probs_delta"] == [0.0] * len(prompt) + logprobs
    assert (record["rollout_id"], record["model_call_id"], record["parent_call_id"]) == (
        "r-0",
        "a1",
        None,
    )
    assert (record["mode"], record["prev_len"], record["weight_version"]) == ("text", 0, 0)
    assert (record["delta_len"], record["cum_len"]) == (len(prompt + generated),) * 2
    assert record["extras"] is None
    assert record["extras_digest"] == EMPTY_EXTRAS_DIGEST
    assert record["chain_hash"] == compute_chain_hash(None, prompt + generated)
    assert record["cumulative_hash"] == hash_token_ids(prompt + generated)

    coords = reply.coords
    assert coords.staged
    assert coords.staging_key == "r-0/a1"
    for name in (
        "rollout_id",
        "model_call_id",
        "parent_call_id",
        "prev_len",
        "delta_len",
        "cum_len",
        "weight_version",
        "digest",
        "extras_digest",
        "chain_hash",
        "cumulative_hash",
    ):
        assert getattr(coords, name) == record[name], name
    for path in staged_files(worker.staging_dir):
        assert not any(secret.encode() in path.read_bytes() for secret in SECRETS)
    assert await worker.counts() == (1, 0, 0)


async def test_a_child_pins_its_chain_upstream_and_stages_only_the_delta(
    worker: Worker, upstream: FakeUpstream
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    chain: list[CommitCoords] = []
    answers: list[dict[str, Any]] = []
    for turn, call_id in enumerate(("c1", "c2", "c3")):
        if chain:
            keys = [c.staging_key for c in chain if c.staging_key is not None]
            capture = child_admission(call_id, chain[-1], keys)
        else:
            capture = root_admission(call_id)
        reply = await worker.post(chat_body(messages, capture))
        assert reply.status == 200, reply.body
        assert reply.coords.staged
        chain.append(reply.coords)
        answers.append(reply.answer)
        messages += [_assistant(reply.answer), {"role": "user", "content": f"And then ({turn})?"}]

    parent_ids: list[int] = []
    sent_bodies = upstream.requests
    for index, (coords, answer, sent) in enumerate(zip(chain, answers, sent_bodies, strict=True)):
        prompt, generated = answer["prompt_token_ids"], _generated(answer)
        record = record_json(worker.staging_dir, "r-0", coords.model_call_id)
        if index == 0:
            assert PREFIX_IDS_FIELD not in sent.json
        else:
            # Exactly the chain's ids: the parents' deltas concatenated, root first.
            assert sent.json[PREFIX_IDS_FIELD] == parent_ids
            assert prompt[: len(parent_ids)] == parent_ids
            assert record["parent_call_id"] == chain[index - 1].model_call_id
            assert record["mode"] == "token_in"
        assert record["prev_len"] == coords.prev_len == len(parent_ids)
        assert record["token_ids_delta"] == prompt[len(parent_ids) :] + generated
        carry = len(prompt) - len(parent_ids)
        assert record["token_mask_delta"] == [0.0] * carry + [1.0] * len(generated)
        assert record["generation_log_probs_delta"] == [0.0] * carry + [
            fake_logprob(t, i) for i, t in enumerate(generated)
        ]
        previous = None if index == 0 else chain[index - 1].chain_hash
        assert record["chain_hash"] == compute_chain_hash(previous, record["token_ids_delta"])
        assert record["cumulative_hash"] == hash_token_ids(prompt + generated)
        parent_ids = prompt + generated
        assert coords.cum_len == len(parent_ids)

    row = rebuild(worker.staging_dir, chain)
    assert row.model_call_ids == ["c1", "c2", "c3"]
    assert row.token_ids == parent_ids
    assert not any(CAPTURE_FIELD in r.json for r in upstream.requests)
    assert await worker.counts() == (3, 0, 0)


async def test_an_inline_prefix_admission_is_pinned_and_staged(
    worker: Worker, upstream: FakeUpstream
) -> None:
    root = await worker.post(chat_body(capture=root_admission("a1")))
    parent_ids = root.answer["prompt_token_ids"] + _generated(root.answer)
    capture = child_admission("a2", root.coords, [], inline=parent_ids)
    messages = [
        {"role": "user", "content": FIRST_QUESTION},
        _assistant(root.answer),
        {"role": "user", "content": "Why?"},
    ]
    child = await worker.post(chat_body(messages, capture))

    assert child.status == 200, child.body
    assert child.coords.staged
    assert upstream.requests[1].json[PREFIX_IDS_FIELD] == parent_ids
    prompt = render_prompt(messages, prefix_ids=parent_ids)
    assert child.answer["prompt_token_ids"] == prompt
    record = record_json(worker.staging_dir, "r-0", "a2")
    assert record["token_ids_delta"] == prompt[len(parent_ids) :] + _generated(child.answer)
    assert rebuild(worker.staging_dir, [root.coords, child.coords]).token_ids == (
        prompt + _generated(child.answer)
    )


async def test_extras_and_float64_logprobs_are_staged_as_the_engine_sent_them(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    routed = "nrlre1:int16:2x1x2:AwABAAIABQA="
    spans = [{"modality": "image", "offset": 1, "length": 2, "placeholder_id": 9}]
    # -0.1 and 1/3 have no exact binary32 value: the record keeps the float64 the engine sent.
    logprobs = [-0.1, -1 / 3]
    answer = {
        **vllm_answer([1, 9, 9], [7, 2], logprobs, routed_experts=routed),
        "media_spans": spans,
    }
    received: list[dict[str, Any]] = []

    async def engine(request: dict[str, Any]) -> web.StreamResponse:
        received.append(request)
        return web.json_response(answer)

    async with (
        stub_upstream(engine) as upstream_url,
        worker_at(settings_for(upstream_url, staging_dir)) as url,
    ):
        reply = await Worker(url, staging_dir, session).post(
            chat_body(capture=root_admission("m1"))
        )

    assert reply.status == 200, reply.body
    assert reply.answer == answer
    record = record_json(staging_dir, "r-0", "m1")
    assert record["extras"] == {"routed_experts": routed, "media_spans": spans}
    assert record["extras_digest"] == compute_extras_digest(record["extras"])
    assert reply.coords.extras_digest == record["extras_digest"]
    assert record["generation_log_probs_delta"] == [0.0, 0.0, 0.0, -0.1, -1 / 3]
    raw = (staging_dir / "r-0" / "m1" / "record.json").read_bytes()
    assert b"-0.1," in raw
    assert b"-0.3333333333333333]" in raw
    assert DirectoryStagingSink(staging_dir).fetch_record("r-0/m1").extras == record["extras"]


# -- refusals ----------------------------------------------------------------------------------


async def test_streaming_with_capture_is_refused_before_upstream(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=root_admission("a1"), stream=True))

    assert reply.status == 400
    error = reply.json["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "stream",
        None,
    )
    assert "stream" in error["message"]
    assert upstream.requests == []
    assert staged_files(worker.staging_dir) == []


_ROOT = root_admission("a1")
_CHILD = {
    **_ROOT,
    "model_call_id": "a2",
    "parent_call_id": "a1",
    "prev_len": 3,
    "mode": "token_in",
    "staging_chain": ["r-0/a1"],
    "parent_chain_hash": "0" * 64,
}


@pytest.mark.parametrize(
    ("capture", "named"),
    [
        ("r-0/a1", "JSON object, not a string"),
        (None, "JSON object, not null"),
        ([1], "JSON object, not an array"),
        ({"model_call_id": "a1", "mode": "text"}, "ng_capture.rollout_id: Field required"),
        ({**_ROOT, "mode": None}, "ng_capture.mode"),
        ({**_ROOT, "model_call_id": ""}, "ng_capture.model_call_id"),
        ({**_ROOT, "parent_model_call_id": "a0"}, "ng_capture.parent_model_call_id"),
        ({**_ROOT, "schema_version": 1}, "ng_capture.schema_version"),
        ({**_ROOT, "parent_call_id": "a0"}, "a text admission has no parent"),
        ({**_CHILD, "parent_chain_hash": None}, "needs a chain hash"),
        ({**_CHILD, "prev_len": True}, "ng_capture.prev_len"),
        ({**_CHILD, "prev_len": 0}, "prev_len > 0"),
        ({**_CHILD, "staging_chain": []}, "inline prefix must have prev_len ids"),
        ({**_CHILD, "required_prefix_token_ids": [1, -2, 3]}, "required_prefix_token_ids.1"),
        ({**_CHILD, "parent_chain_hash": "F" * 64}, "ng_capture.parent_chain_hash"),
    ],
)
async def test_an_invalid_admission_is_refused_naming_ng_capture(
    worker: Worker, upstream: FakeUpstream, capture: Any, named: str
) -> None:
    body = {**chat_body(), CAPTURE_FIELD: capture}
    reply = await worker.post(body)

    assert reply.status == 400
    error = reply.json["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", CAPTURE_FIELD)
    assert CAPTURE_FIELD in error["message"]
    assert named in error["message"]
    assert "\n" not in error["message"]
    assert upstream.requests == []
    assert await worker.counts() == (0, 0, 0)


@pytest.mark.parametrize("pin", [[1, 2, 3], "1 2", [1.0]])
async def test_a_body_pin_that_is_not_the_admissions_is_refused(
    worker: Worker, upstream: FakeUpstream, pin: object
) -> None:
    body = {**chat_body(capture=root_admission("a1")), PREFIX_IDS_FIELD: pin}
    reply = await worker.post(body)

    assert reply.status == 400
    assert reply.json["error"]["param"] == PREFIX_IDS_FIELD
    assert upstream.requests == []


# -- calls that are served but not staged ------------------------------------------------------


async def test_a_chain_key_that_does_not_exist_is_served_as_capture_failed(
    worker: Worker, upstream: FakeUpstream
) -> None:
    root = await worker.post(chat_body(capture=root_admission("a1")))
    capture = child_admission("a2", root.coords, ["r-0/nowhere"])
    messages = [
        {"role": "user", "content": FIRST_QUESTION},
        _assistant(root.answer),
        {"role": "user", "content": "Why?"},
    ]
    reply = await worker.post(chat_body(messages, capture))

    assert reply.status == 200, reply.body
    _assert_failed_shape(reply.coords, capture, 0)
    assert reply.answer["choices"][0]["message"]["content"]
    # The engine answered from the messages, unpinned; nothing of the call was staged.
    assert PREFIX_IDS_FIELD not in upstream.requests[1].json
    assert DirectoryStagingSink(worker.staging_dir).rollout_keys("r-0") == ["r-0/a1"]
    assert await worker.counts() == (1, 1, 0)
    # And when the engine fails that call too, its failure is what the gate gets.
    failed = await worker.post(chat_body(messages, capture), scenario="http_503")
    assert failed.status == 503
    assert COORDS_FIELD not in failed.json
    assert await worker.counts() == (1, 2, 0)


@pytest.mark.parametrize("broken", ["parent_chain_hash", "parent_call_id", "prev_len"])
async def test_a_chain_that_does_not_end_at_the_admissions_parent_is_not_pinned(
    worker: Worker, upstream: FakeUpstream, broken: str
) -> None:
    root = await worker.post(chat_body(capture=root_admission("a1")))
    capture = child_admission("a2", root.coords, ["r-0/a1"])
    capture[broken] = {"parent_chain_hash": "0" * 64, "parent_call_id": "a0", "prev_len": 4}[broken]
    reply = await worker.post(chat_body(capture=capture))

    assert reply.status == 200, reply.body
    _assert_failed_shape(reply.coords, capture, 0)
    assert PREFIX_IDS_FIELD not in upstream.requests[1].json
    assert await worker.counts() == (1, 1, 0)


async def test_an_engine_that_does_not_honour_the_prefix_is_served_as_capture_failed(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    received: list[dict[str, Any]] = []
    # The second prompt is longer than the pin but does not start with it.
    answers = [
        vllm_answer([1, 9, 9, 9, 4], [7, 2]),
        vllm_answer([1, 9, 9, 9, 4, 7, 3, 1, 5], [8, 2]),
    ]

    async def ignores_the_pin(request: dict[str, Any]) -> web.StreamResponse:
        received.append(request)
        return web.json_response(answers[len(received) - 1])

    async with (
        stub_upstream(ignores_the_pin) as upstream_url,
        worker_at(settings_for(upstream_url, staging_dir)) as url,
    ):
        worker = Worker(url, staging_dir, session)
        root = await worker.post(chat_body(capture=root_admission("a1")))
        assert root.coords.staged
        capture = child_admission("a2", root.coords, ["r-0/a1"])
        reply = await worker.post(chat_body(capture=capture))
        counts = await worker.counts()

    assert received[1][PREFIX_IDS_FIELD] == [1, 9, 9, 9, 4, 7, 2]
    assert reply.status == 200
    _assert_failed_shape(reply.coords, capture, 0)
    assert reply.answer == answers[1]
    assert DirectoryStagingSink(staging_dir).rollout_keys("r-0") == ["r-0/a1"]
    assert counts == (1, 1, 0)


async def test_an_answer_without_token_ids_is_served_as_capture_failed(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    plain = vllm_answer([1], [7, 2])
    del plain["prompt_token_ids"]

    async def no_ids(request: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(plain)

    async with (
        stub_upstream(no_ids) as upstream_url,
        worker_at(settings_for(upstream_url, staging_dir, weight_version=5)) as url,
    ):
        reply = await Worker(url, staging_dir, session).post(
            chat_body(capture=root_admission("a1"))
        )

    assert reply.status == 200
    _assert_failed_shape(reply.coords, root_admission("a1"), 5)
    assert reply.answer == plain
    assert staged_files(staging_dir) == []


# -- the upstream fails ------------------------------------------------------------------------


async def _retry_stages(worker: Worker, capture: dict[str, Any]) -> None:
    """The failed call left nothing behind: the same admission stages now."""
    again = await worker.post(chat_body(capture=capture))
    assert again.status == 200, again.body
    assert again.coords.staged


async def test_an_upstream_error_passes_through_and_fails_the_call(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=root_admission("a1")), scenario="http_500")
    async with worker.session.post(
        upstream.url + CHAT,
        data=orjson.dumps(chat_body()),
        headers={"x-fake-scenario": "http_500", "authorization": f"Bearer {UPSTREAM_KEY}"},
    ) as response:
        direct = await response.read()

    assert reply.status == 500
    assert reply.body == direct
    assert COORDS_FIELD not in reply.json
    assert staged_files(worker.staging_dir) == []
    assert await worker.counts() == (0, 1, 0)
    await _retry_stages(worker, root_admission("a1"))
    assert await worker.counts() == (1, 1, 0)


async def test_invalid_json_from_upstream_is_a_502(worker: Worker, upstream: FakeUpstream) -> None:
    reply = await worker.post(chat_body(capture=root_admission("a1")), scenario="malformed_json")

    assert reply.status == 502
    assert reply.json["error"]["message"] == "upstream answered with invalid JSON"
    assert staged_files(worker.staging_dir) == []
    assert await worker.counts() == (0, 1, 0)
    await _retry_stages(worker, root_admission("a1"))


async def test_an_upstream_that_goes_silent_is_a_504(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    settings = settings_for(upstream.url, staging_dir, read_timeout_s=0.3)
    async with worker_at(settings) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=root_admission("a1")), scenario="hang")
        assert reply.status == 504
        assert reply.json["error"]["type"] == "timeout"
        assert await worker.counts() == (0, 1, 0)
        await _retry_stages(worker, root_admission("a1"))


async def test_an_unreachable_upstream_is_a_502(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with worker_at(settings_for(f"http://127.0.0.1:{port}", staging_dir)) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=root_admission("a1")))
        models = await worker.get("/v1/models")
        assert reply.status == 502
        assert reply.json["error"]["type"] == "api_connection_error"
        assert models.status == 502
        assert staged_files(staging_dir) == []
        assert await worker.counts() == (0, 1, 0)
        # Once the upstream is there, the same call stages: the failed one was ended.
        async with FakeUpstream(port=port, api_key=UPSTREAM_KEY):
            await _retry_stages(worker, root_admission("a1"))


async def test_a_failed_call_is_logged_with_its_reason(
    worker: Worker, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rollcap.worker"):
        reply = await worker.post(chat_body(capture=root_admission("a1")), scenario="http_503")

    assert reply.status == 503
    assert "r-0/a1 not staged: upstream answered HTTP 503" in caplog.text
    assert await worker.counts() == (0, 1, 0)


async def test_a_cancelled_call_is_ended_once(upstream: FakeUpstream, staging_dir: Path) -> None:
    # In-process, so cancelling the client's request cancels the worker's handler with it.
    app = create_worker_app(settings_for(upstream.url, staging_dir))
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://worker"
        ) as client,
    ):
        body = chat_body(capture=root_admission("a1"))
        hanging = asyncio.create_task(
            client.post(CHAT, json=body, headers={"x-fake-scenario": "hang"})
        )
        while upstream.in_flight == 0:
            await asyncio.sleep(0.01)
        assert (await client.get("/health")).json()["in_flight"] == 1
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        after_cancel = (await client.get("/health")).json()
        again = await client.post(CHAT, json=body)
        health = (await client.get("/health")).json()

    assert (after_cancel["staged"], after_cancel["capture_failed"]) == (0, 1)
    assert after_cancel["in_flight"] == 0
    assert again.status_code == 200
    assert CommitCoords.model_validate(again.json()[COORDS_FIELD]).staged
    assert (health["staged"], health["capture_failed"], health["in_flight"]) == (1, 1, 0)


# -- pass-through and health -------------------------------------------------------------------


async def test_without_an_admission_the_call_passes_through(
    worker: Worker, upstream: FakeUpstream
) -> None:
    plain = await worker.post(chat_body())
    async with worker.session.post(
        worker.url + CHAT,
        data=orjson.dumps(chat_body(stream=True, stream_options={"include_usage": True})),
        headers={"x-fake-events": "5"},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        streamed = await response.read()
    async with worker.session.post(
        upstream.url + CHAT,
        data=orjson.dumps(chat_body(stream=True, stream_options={"include_usage": True})),
        headers={"x-fake-events": "5", "authorization": f"Bearer {UPSTREAM_KEY}"},
    ) as response:
        direct = await response.read()
    escaped = b'{"model": "fake-model", "messages": [{"role": "user", "content": "caf\\u00e9"}]}'
    async with worker.session.post(worker.url + CHAT, data=escaped) as response:
        escaped_status = response.status
    async with worker.session.post(worker.url + CHAT, data=b"{not json") as response:
        not_json_status = response.status

    assert plain.status == 200
    assert plain.json == expected_response("chat", chat_body(), {"x-fake-scenario": "text"})
    assert streamed == direct
    assert streamed.rstrip().endswith(b"data: [DONE]")
    assert escaped_status == 200
    assert not_json_status == 400  # the upstream's own answer to a body it cannot read
    sent = upstream.requests[0]
    assert sent.json == chat_body()
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert [r.body for r in upstream.requests[-2:]] == [escaped, b"{not json"]
    assert staged_files(worker.staging_dir) == []
    assert await worker.counts() == (0, 0, 0)


async def test_an_escaped_admission_key_is_still_an_admission(
    worker: Worker, upstream: FakeUpstream
) -> None:
    body = orjson.dumps(chat_body(capture=root_admission("a1"))).replace(
        b'"ng_capture"', b'"ng\\u005fcapture"'
    )
    async with worker.session.post(worker.url + CHAT, data=body) as response:
        reply = Reply(response.status, await response.read(), dict(response.headers))

    assert reply.status == 200, reply.body
    assert reply.coords.staged
    assert CAPTURE_FIELD not in upstream.requests[0].json


async def test_models_and_health(worker: Worker, upstream: FakeUpstream) -> None:
    models = await worker.get("/v1/models?limit=5")
    health = await worker.health()

    assert models.status == 200
    assert models.json["data"]
    assert upstream.requests[0].query == "limit=5"
    assert upstream.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert health == {
        "status": "ok",
        "upstream": upstream.url + "/v1",
        "staging_dir": str(worker.staging_dir),
        "weight_version": 0,
        "staged": 0,
        "capture_failed": 0,
        "in_flight": 0,
    }
    assert UPSTREAM_KEY not in orjson.dumps(health).decode()


async def test_the_weight_version_is_stamped(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    async with worker_at(settings_for(upstream.url, staging_dir, weight_version=7)) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=root_admission("a1")))
        assert (await worker.health())["weight_version"] == 7

    assert reply.coords.weight_version == 7
    assert record_json(staging_dir, "r-0", "a1")["weight_version"] == 7


async def test_the_openai_sdk_as_a_client(worker: Worker, upstream: FakeUpstream) -> None:
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=worker.url + "/v1", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        messages: Any = [{"role": "user", "content": FIRST_QUESTION}]
        completion = await client.chat.completions.create(
            model="fake-model", messages=messages, extra_body={CAPTURE_FIELD: root_admission("a")}
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="fake-model",
                messages=messages,
                stream=True,
                extra_body={CAPTURE_FIELD: root_admission("b")},
            )
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="fake-model",
                messages=messages,
                extra_body={CAPTURE_FIELD: {**root_admission("c"), "mode": "tokens"}},
            )
        plain = await client.chat.completions.create(model="fake-model", messages=messages)
        models = await client.models.list()

    coords = CommitCoords.model_validate((completion.model_extra or {})[COORDS_FIELD])
    assert (coords.staged, coords.staging_key) == (True, "r-0/a")
    assert completion.choices[0].message.content
    assert refused.value.param == "stream"
    assert bad.value.param == CAPTURE_FIELD
    assert "ng_capture.mode" in bad.value.message
    assert COORDS_FIELD not in (plain.model_extra or {})
    assert [m.id for m in models.data]
    chats = [r for r in upstream.requests if r.path == CHAT]
    assert len(chats) == 2
    assert all(r.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" for r in upstream.requests)
    assert DirectoryStagingSink(worker.staging_dir).rollout_keys("r-0") == ["r-0/a"]


async def test_concurrent_calls_on_several_rollouts(worker: Worker, upstream: FakeUpstream) -> None:
    rollouts = [f"r-{n}" for n in range(8)]
    roots = await asyncio.gather(
        *(worker.post(chat_body(capture=root_admission("a0", rollout_id=r))) for r in rollouts)
    )
    assert all(reply.coords.staged for reply in roots)

    def follow_up(root: Reply, branch: int) -> dict[str, Any]:
        messages = [
            {"role": "user", "content": FIRST_QUESTION},
            _assistant(root.answer),
            {"role": "user", "content": f"Branch {branch} of {root.coords.rollout_id}?"},
        ]
        assert root.coords.staging_key is not None
        capture = child_admission(f"b{branch}", root.coords, [root.coords.staging_key])
        return chat_body(messages, capture)

    pairs = [(root, follow_up(root, branch)) for root in roots for branch in range(4)]
    replies = await asyncio.gather(*(worker.post(body) for _, body in pairs))

    assert all(reply.status == 200 and reply.coords.staged for reply in replies)
    for (root, _), reply in zip(pairs, replies, strict=True):
        row = rebuild(worker.staging_dir, [root.coords, reply.coords])
        assert row.token_ids == reply.answer["prompt_token_ids"] + _generated(reply.answer)
        assert reply.coords.prev_len == root.coords.cum_len
    assert await worker.counts() == (40, 0, 0)


async def test_a_restarted_worker_continues_a_chain_from_its_staging_directory(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    settings = settings_for(upstream.url + "/v1", staging_dir)
    async with worker_at(settings) as url:
        first = await Worker(url, staging_dir, session).post(
            chat_body(messages, root_admission("c1"))
        )
    messages += [_assistant(first.answer), {"role": "user", "content": "More?"}]
    async with worker_at(settings) as url:  # a new process would start just like this
        second = await Worker(url, staging_dir, session).post(
            chat_body(messages, child_admission("c2", first.coords, ["r-0/c1"]))
        )
    assert second.coords.staged
    assert rebuild(staging_dir, [first.coords, second.coords]).model_call_ids == ["c1", "c2"]


async def test_a_passed_through_stream_that_upstream_breaks_breaks_the_same_way(
    worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with worker.session.post(
        worker.url + CHAT,
        data=orjson.dumps(chat_body(stream=True)),
        headers={"x-fake-scenario": "truncate", "x-fake-events": "8"},
    ) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()  # no clean end an SDK could take for a finished answer
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert not [m for m in messages if "without completing response" in m[1]]
    assert not [m for m in messages if "Exception in ASGI application" in m[1]]
    assert [m[0] for m in messages if "upstream broke off its answer" in m[1]] == ["rollcap.worker"]
    assert (await worker.post(chat_body())).status == 200


async def test_a_passed_through_body_that_upstream_cuts_short_is_cut_the_same_way(
    worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with worker.session.post(
        worker.url + CHAT,
        data=orjson.dumps(chat_body()),
        headers={"x-fake-scenario": "truncate"},
    ) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert not [m for m in messages if "Exception in ASGI application" in m[1]]
    assert [m[0] for m in messages if "upstream broke off its answer" in m[1]] == ["rollcap.worker"]
    assert (await worker.post(chat_body())).status == 200
