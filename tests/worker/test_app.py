"""The capture worker over real sockets, in front of the fake upstream (or a stub)."""

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

from rollcap._runtime.serving import serving
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.staging import (
    CAPTURE_FAILED,
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    REASON_DUPLICATE_CALL,
    REASON_EXTRACTION_FAILED,
    REASON_REQUIRED_PREFIX_MISMATCH,
    REASON_UNKNOWN_PARENT,
    CommitCoords,
    DirectoryStagingSink,
    linearize,
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
    admission,
    chat_body,
    free_port,
    settings_for,
    stub_upstream,
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


def _staged_files(staging_dir: Path) -> list[Path]:
    return sorted(p for p in staging_dir.rglob("*") if p.is_file())


def _without_coords(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != COORDS_FIELD}


async def test_a_captured_call_is_staged_with_the_upstreams_ids(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=admission("a1")))

    assert reply.status == 200, reply.body
    coords = reply.coords
    assert coords.staged
    assert (coords.staging_key, coords.reason) == ("r-0/a1", None)
    (sent,) = upstream.requests
    assert CAPTURE_FIELD not in sent.json
    assert all(sent.json[name] is True for name in TOKEN_FIELDS)
    assert PREFIX_IDS_FIELD not in sent.json
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    # The answer is the upstream's, token fields included, plus the coords.
    answer = _without_coords(reply.json)
    assert answer == expected_response("chat", sent.json, {"x-fake-scenario": "text"})
    prompt = render_prompt([{"role": "user", "content": FIRST_QUESTION}])
    generated = _generated(answer)
    assert answer["prompt_token_ids"] == prompt
    assert answer["choices"][0]["token_ids"] == generated

    (record,) = DirectoryStagingSink(worker.staging_dir).read("r-0")
    assert record.coords() == coords
    assert list(record.token_ids) == prompt + generated
    assert list(record.loss_mask) == [0] * len(prompt) + [1] * len(generated)
    assert list(record.logprobs) == [0.0] * len(prompt) + [
        fake_logprob(t, i) for i, t in enumerate(generated)
    ]
    assert (record.prev_len, record.weight_version) == (0, 0)
    for path in _staged_files(worker.staging_dir):
        assert not any(secret.encode() in path.read_bytes() for secret in SECRETS)
    assert (await worker.health())["staged"] == 1


async def test_a_three_turn_chain_linearizes_to_the_last_prompt_and_answer(
    worker: Worker, upstream: FakeUpstream
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    parent: str | None = None
    spans: list[tuple[int, int]] = []  # where each turn's generated ids sit
    coords: list[CommitCoords] = []
    answer: dict[str, Any] = {}
    for turn, call_id in enumerate(("c1", "c2", "c3")):
        reply = await worker.post(chat_body(messages, admission(call_id, parent=parent)))
        assert reply.status == 200, reply.body
        assert reply.coords.staged, reply.coords.reason
        coords.append(reply.coords)
        answer = _without_coords(reply.json)
        start = len(answer["prompt_token_ids"])
        spans.append((start, start + len(answer["choices"][0]["token_ids"])))
        messages += [_assistant(answer), {"role": "user", "content": f"And then ({turn})?"}]
        parent = call_id

    (chain,) = linearize(worker.staging_dir, "r-0", coords=coords)
    last_prompt = render_prompt(messages[:-2])
    assert answer["prompt_token_ids"] == last_prompt
    assert chain.model_call_ids == ("c1", "c2", "c3")
    assert chain.token_ids == last_prompt + _generated(answer)
    expected_mask = [0] * len(chain.token_ids)
    expected_logprobs = [0.0] * len(chain.token_ids)
    for start, end in spans:
        for position in range(start, end):
            expected_mask[position] = 1
            expected_logprobs[position] = fake_logprob(chain.token_ids[position], position - start)
    assert chain.loss_mask == expected_mask
    assert chain.logprobs == expected_logprobs
    assert chain.weight_versions == (0, 0, 0)
    assert chain.prev_lens == (0, spans[0][1], spans[1][1])
    assert not any(CAPTURE_FIELD in r.json for r in upstream.requests)


async def test_the_openai_sdk_as_a_client(worker: Worker, upstream: FakeUpstream) -> None:
    async with httpx2.AsyncClient() as http:
        client = openai.AsyncOpenAI(
            base_url=worker.url + "/v1", api_key=CLIENT_KEY, max_retries=0, http_client=http
        )
        completion = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": FIRST_QUESTION}],
            extra_body={CAPTURE_FIELD: admission("5d")},
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": FIRST_QUESTION}],
                stream=True,
                extra_body={CAPTURE_FIELD: admission("5e")},
            )
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": FIRST_QUESTION}],
                extra_body={CAPTURE_FIELD: admission("NOT-HEX")},
            )
        plain = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": FIRST_QUESTION}]
        )
        models = await client.models.list()

    extra = completion.model_extra or {}
    coords = CommitCoords.from_json(extra[COORDS_FIELD])
    assert coords.staged
    assert coords.staging_key == "r-0/5d"
    assert completion.choices[0].message.content
    assert refused.value.param == "stream"
    assert bad.value.param == CAPTURE_FIELD
    assert "model_call_id" in bad.value.message
    assert COORDS_FIELD not in (plain.model_extra or {})
    assert [m.id for m in models.data]
    # Two calls reached upstream (the captured one and the plain one), each with its key only.
    chats = [r for r in upstream.requests if r.path == CHAT]
    assert len(chats) == 2
    assert all(r.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" for r in upstream.requests)
    assert len(DirectoryStagingSink(worker.staging_dir).read("r-0")) == 1


async def test_streaming_with_capture_is_refused_before_upstream(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=admission("a1"), stream=True))

    assert reply.status == 400
    error = reply.json["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "stream",
        None,
    )
    assert "stream" in error["message"]
    assert upstream.requests == []
    assert not worker.staging_dir.exists() or _staged_files(worker.staging_dir) == []


@pytest.mark.parametrize(
    ("capture", "named"),
    [
        ("r-0/a1", "JSON object, not a string"),
        (None, "JSON object, not null"),
        ([1], "JSON object, not an array"),
        ({"model_call_id": "a1"}, "rollout_id is missing"),
        ({"rollout_id": "r-0"}, "model_call_id is missing"),
        (admission("a1", rollout_id="../etc"), "rollout id"),
        (admission("A1!"), "model_call_id"),
        (admission("a1", parent="a1"), "parent_model_call_id"),
        (admission("a1", parent="zz"), "parent_model_call_id"),
        ({**admission("a1"), "required_prefix_token_ids": "1 2"}, "required_prefix_token_ids"),
        (admission("a1", pin=[1, -2]), "required_prefix_token_ids"),
    ],
)
async def test_a_bad_admission_is_refused_naming_the_field(
    worker: Worker, upstream: FakeUpstream, capture: Any, named: str
) -> None:
    reply = await worker.post({**chat_body(), CAPTURE_FIELD: capture})

    assert reply.status == 400
    error = reply.json["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", CAPTURE_FIELD)
    assert error["message"].startswith(CAPTURE_FIELD) or CAPTURE_FIELD in error["message"]
    assert named in error["message"]
    assert upstream.requests == []


async def test_a_pin_in_the_body_must_match_the_admissions(
    worker: Worker, upstream: FakeUpstream
) -> None:
    body = {**chat_body(capture=admission("a1")), PREFIX_IDS_FIELD: [1, 2, 3]}
    reply = await worker.post(body)

    assert reply.status == 400
    assert reply.json["error"]["param"] == PREFIX_IDS_FIELD
    assert upstream.requests == []


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
    async with worker.session.post(worker.url + CHAT, data=b"{not json") as response:
        not_json_status = response.status

    assert plain.status == 200
    assert plain.json == expected_response("chat", chat_body(), {"x-fake-scenario": "text"})
    assert streamed == direct
    assert streamed.rstrip().endswith(b"data: [DONE]")
    assert not_json_status == 400  # the upstream's own answer to a body it cannot read
    sent = upstream.requests[0]
    assert sent.json == chat_body()
    assert sent.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert upstream.requests[-1].body == b"{not json"
    assert _staged_files(worker.staging_dir) == []
    health = await worker.health()
    assert (health["staged"], health["capture_failed"]) == (0, 0)


async def test_models_and_health(worker: Worker, upstream: FakeUpstream) -> None:
    models = await worker.get("/v1/models")
    health = await worker.health()

    assert models.status == 200
    assert models.json["data"]
    assert upstream.requests[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert health == {
        "status": "ok",
        "upstream": upstream.url + "/v1",
        "staging_dir": str(worker.staging_dir),
        "weight_version": 0,
        "staged": 0,
        "capture_failed": 0,
    }
    assert UPSTREAM_KEY not in orjson.dumps(health).decode()


async def _retry_stages(worker: Worker, capture: dict[str, Any]) -> None:
    """The failed call left nothing in flight: the same admission stages now."""
    again = await worker.post(chat_body(capture=capture))
    assert again.status == 200, again.body
    assert again.coords.staged, again.coords.reason


async def test_an_upstream_error_passes_through_and_ends_the_call(
    worker: Worker, upstream: FakeUpstream
) -> None:
    reply = await worker.post(chat_body(capture=admission("a1")), scenario="http_500")
    async with worker.session.post(
        upstream.url + CHAT,
        data=orjson.dumps(chat_body()),
        headers={"x-fake-scenario": "http_500", "authorization": f"Bearer {UPSTREAM_KEY}"},
    ) as response:
        direct = await response.read()

    assert reply.status == 500
    assert reply.body == direct
    assert COORDS_FIELD not in reply.json
    await _retry_stages(worker, admission("a1"))
    health = await worker.health()
    assert (health["staged"], health["capture_failed"]) == (1, 1)


async def test_invalid_json_from_upstream_is_a_502(worker: Worker, upstream: FakeUpstream) -> None:
    reply = await worker.post(chat_body(capture=admission("a1")), scenario="malformed_json")

    assert reply.status == 502
    assert reply.json["error"]["message"] == "upstream answered with invalid JSON"
    await _retry_stages(worker, admission("a1"))


async def test_an_upstream_that_goes_silent_is_a_504(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    settings = settings_for(upstream.url, staging_dir, read_timeout_s=0.3)
    async with worker_at(settings) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=admission("a1")), scenario="hang")
        assert reply.status == 504
        assert reply.json["error"]["type"] == "timeout"
        await _retry_stages(worker, admission("a1"))


async def test_an_unreachable_upstream_is_a_502(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with worker_at(settings_for(f"http://127.0.0.1:{port}", staging_dir)) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=admission("a1")))
        models = await worker.get("/v1/models")
        assert reply.status == 502
        assert reply.json["error"]["type"] == "api_connection_error"
        assert models.status == 502
        # Once the upstream is there, the same call stages: the failed one was ended.
        async with FakeUpstream(port=port, api_key=UPSTREAM_KEY):
            await _retry_stages(worker, admission("a1"))


async def test_calls_the_capture_cannot_stage_are_still_served(
    worker: Worker, upstream: FakeUpstream
) -> None:
    first = await worker.post(chat_body(capture=admission("a1")))
    duplicate = await worker.post(chat_body(capture=admission("a1")))
    orphan = await worker.post(chat_body(capture=admission("b1", parent="ff")))

    assert first.coords.staged
    for reply, reason in ((duplicate, REASON_DUPLICATE_CALL), (orphan, REASON_UNKNOWN_PARENT)):
        assert reply.status == 200
        assert reply.coords.disposition == CAPTURE_FAILED
        assert reply.coords.reason_code == reason
        assert reply.json["choices"][0]["message"]["content"]
    assert len(DirectoryStagingSink(worker.staging_dir).read("r-0")) == 1
    health = await worker.health()
    assert (health["staged"], health["capture_failed"]) == (1, 2)


async def test_a_pinned_prefix_goes_upstream_and_is_honoured(
    worker: Worker, upstream: FakeUpstream
) -> None:
    first = await worker.post(chat_body(capture=admission("a1")))
    answer = first.json
    parent_ids = answer["prompt_token_ids"] + answer["choices"][0]["token_ids"]
    # Compaction: the next turn continues from the parent's ids minus its last one.
    pin = parent_ids[:-1]
    follow_up = {"role": "user", "content": "Why?"}
    messages = [{"role": "user", "content": FIRST_QUESTION}, _assistant(answer), follow_up]
    second = await worker.post(chat_body(messages, admission("a2", parent="a1", pin=pin)))

    assert second.status == 200, second.body
    assert second.coords.staged, second.coords.reason
    assert upstream.requests[1].json[PREFIX_IDS_FIELD] == pin
    prompt = render_prompt(messages, prefix_ids=pin)
    assert second.json["prompt_token_ids"] == prompt
    assert second.coords.prev_len == len(pin)
    (chain,) = linearize(worker.staging_dir, "r-0", coords=[first.coords, second.coords])
    assert chain.token_ids == prompt + _generated(second.json)
    assert chain.loss_mask[: len(pin)] == [0] * len(answer["prompt_token_ids"]) + [1] * (
        len(pin) - len(answer["prompt_token_ids"])
    )


def _vllm_answer(prompt: list[int], generated: list[int]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1,
        "model": "stub",
        "prompt_token_ids": prompt,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": generated,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": -0.5, "bytes": [], "top_logprobs": []}
                        for t in generated
                    ]
                },
            }
        ],
    }


async def test_a_pinned_prefix_the_prompt_does_not_start_with_fails_closed(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    received: list[dict[str, Any]] = []

    async def ignores_the_pin(request: dict[str, Any]) -> web.StreamResponse:
        received.append(request)
        return web.json_response(_vllm_answer([1, 9, 9, 9], [7, 2]))

    async with (
        stub_upstream(ignores_the_pin) as upstream_url,
        worker_at(settings_for(upstream_url, staging_dir)) as url,
    ):
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=admission("a1", pin=[1, 5, 5])))
        health = await worker.health()

    assert reply.status == 409
    error = reply.json["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "required_prefix_mismatch")
    assert reply.coords.disposition == CAPTURE_FAILED
    assert reply.coords.reason_code == REASON_REQUIRED_PREFIX_MISMATCH
    assert "choices" not in reply.json
    assert received[0][PREFIX_IDS_FIELD] == [1, 5, 5]
    assert _staged_files(staging_dir) == []
    assert (health["staged"], health["capture_failed"]) == (0, 1)


async def test_an_answer_without_token_ids_is_served_as_capture_failed(
    staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    plain = _vllm_answer([1], [7, 2])
    del plain["prompt_token_ids"]

    async def no_ids(request: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(plain)

    async with (
        stub_upstream(no_ids) as upstream_url,
        worker_at(settings_for(upstream_url, staging_dir)) as url,
    ):
        reply = await Worker(url, staging_dir, session).post(chat_body(capture=admission("a1")))

    assert reply.status == 200
    assert reply.coords.reason_code == REASON_EXTRACTION_FAILED
    assert _without_coords(reply.json) == plain


async def test_concurrent_calls_on_several_rollouts(worker: Worker, upstream: FakeUpstream) -> None:
    rollouts = [f"r-{n}" for n in range(8)]
    roots = await asyncio.gather(
        *(worker.post(chat_body(capture=admission("a0", rollout_id=r))) for r in rollouts)
    )
    assert all(reply.coords.staged for reply in roots)

    def follow_up(root: Reply, rollout_id: str, branch: int) -> dict[str, Any]:
        messages = [
            {"role": "user", "content": FIRST_QUESTION},
            _assistant(root.json),
            {"role": "user", "content": f"Branch {branch} of {rollout_id}?"},
        ]
        return chat_body(messages, admission(f"b{branch}", rollout_id=rollout_id, parent="a0"))

    bodies = [
        (rollout_id, follow_up(root, rollout_id, branch))
        for root, rollout_id in zip(roots, rollouts, strict=True)
        for branch in range(4)
    ]
    replies = await asyncio.gather(*(worker.post(body) for _, body in bodies))

    assert len(replies) == 32
    assert all(reply.status == 200 and reply.coords.staged for reply in replies)
    for rollout_id, root in zip(rollouts, roots, strict=True):
        chains = linearize(worker.staging_dir, rollout_id)
        assert sorted(c.model_call_ids for c in chains) == [("a0", f"b{n}") for n in range(4)]
        by_leaf = {
            reply.coords.model_call_id: reply.json
            for (rid, _), reply in zip(bodies, replies, strict=True)
            if rid == rollout_id
        }
        for chain in chains:
            leaf = by_leaf[chain.leaf_model_call_id]
            assert chain.token_ids == leaf["prompt_token_ids"] + leaf["choices"][0]["token_ids"]
            assert chain.prev_lens[1] == root.coords.cum_len
    health = await worker.health()
    assert (health["staged"], health["capture_failed"]) == (40, 0)


async def test_the_weight_version_is_stamped(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    async with worker_at(settings_for(upstream.url, staging_dir, weight_version=7)) as url:
        worker = Worker(url, staging_dir, session)
        reply = await worker.post(chat_body(capture=admission("a1")))
        assert (await worker.health())["weight_version"] == 7

    assert reply.coords.staged
    (record,) = DirectoryStagingSink(staging_dir).read("r-0")
    assert record.weight_version == 7


async def test_a_failed_call_is_ended_with_a_reason(
    worker: Worker, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rollcap.worker"):
        reply = await worker.post(chat_body(capture=admission("a1")), scenario="http_503")

    assert reply.status == 503
    assert "r-0/a1 not staged: upstream answered HTTP 503" in caplog.text
    assert (await worker.health())["capture_failed"] == 1


async def test_a_cancelled_call_is_ended(upstream: FakeUpstream, staging_dir: Path) -> None:
    # In-process, so cancelling the client's request cancels the worker's handler with it.
    app = create_worker_app(settings_for(upstream.url, staging_dir))
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://worker"
        ) as client,
    ):
        body = chat_body(capture=admission("a1"))
        hanging = asyncio.create_task(
            client.post(CHAT, json=body, headers={"x-fake-scenario": "hang"})
        )
        while upstream.in_flight == 0:
            await asyncio.sleep(0.01)
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        again = await client.post(CHAT, json=body)
        health = (await client.get("/health")).json()

    assert again.status_code == 200
    assert CommitCoords.from_json(again.json()[COORDS_FIELD]).staged
    assert (health["staged"], health["capture_failed"]) == (1, 1)


async def test_behind_the_model_server(
    upstream: FakeUpstream, tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """The whole RL path: client -> model server (external staging) -> worker -> upstream."""
    staging_dir = tmp_path / "staging"
    async with worker_at(settings_for(upstream.url + "/v1", staging_dir)) as worker_url:
        model = ModelServerSettings(
            model_type="vllm_model",
            base_url=worker_url + "/v1",
            capture_dir=tmp_path / "calls",
            external_staging=True,
            ledger_dir=tmp_path / "ledger",
        )
        async with serving(create_model_app(model)) as model_url:
            messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
            for turn in range(3):
                async with session.post(
                    f"{model_url}/ng-rollout/m-0{CHAT}",
                    json={"model": "fake-model", "messages": messages},
                ) as response:
                    assert response.status == 200
                    answer = await response.json()
                assert COORDS_FIELD not in answer
                assert "token_ids" not in answer["choices"][0]
                messages += [_assistant(answer), {"role": "user", "content": f"Then ({turn})?"}]

    (chain,) = linearize(staging_dir, "m-0")
    assert len(chain.model_call_ids) == 3
    assert not any(CAPTURE_FIELD in r.json for r in upstream.requests)
    last_answer = [*encode(messages[-2]["content"]), END]
    assert chain.token_ids == render_prompt(messages[:-2]) + last_answer


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
    # The worker keeps serving.
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
        # Upstream's status and the bytes it sent, then the connection breaks as upstream's did:
        # the client sees what it would have seen without the worker, as the model server does.
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert not [m for m in messages if "Exception in ASGI application" in m[1]]
    assert [m[0] for m in messages if "upstream broke off its answer" in m[1]] == ["rollcap.worker"]
    assert (await worker.post(chat_body())).status == 200


async def test_a_restarted_worker_continues_the_chain_from_its_staging_directory(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    settings = settings_for(upstream.url + "/v1", staging_dir)
    async with worker_at(settings) as url:
        first = await Worker(url, staging_dir, session).post(chat_body(messages, admission("c1")))
    assert first.coords.staged
    messages += [_assistant(_without_coords(first.json)), {"role": "user", "content": "More?"}]
    async with worker_at(settings) as url:  # a new process would start just like this
        second = await Worker(url, staging_dir, session).post(
            chat_body(messages, admission("c2", parent="c1"))
        )
    assert second.coords.staged, second.coords.reason
    (chain,) = linearize(staging_dir, "r-0")
    assert chain.model_call_ids == ("c1", "c2")
