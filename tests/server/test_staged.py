"""token_id_capture.external_staging: SDK clients, the model server, a capture worker, the fake.

Every call of a rollout is staged by the worker (exact ids and logprobs from the fake upstream's
tokenizer), the model server answers the client's dialect, streamed or not, from the worker's
complete answer, and ``linearize`` rebuilds the rollout as one chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import openai
import orjson
import pytest
from aiohttp import web

from rollcap import CaptureStore
from rollcap._runtime.serving import serving
from rollcap.server import ModelServerSettings, _staged, create_model_app
from rollcap.server._staged import LEDGER_SUFFIX, ledger_store
from rollcap.staging import COORDS_FIELD, CommitCoords, linearize
from rollcap.testing import FakeUpstream, assistant_body, encode, fake_logprob, render_prompt
from rollcap.worker import WorkerSettings, create_worker_app
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY
from tests.server.test_sdks import TOOLS_CHAT, TOOLS_MESSAGES, TOOLS_RESPONSES

END = 2
STREAM = {"stream": True}


@dataclass
class Stack:
    model_url: str
    upstream: FakeUpstream
    staging_dir: Path
    capture_dir: Path | None
    ledger_dir: Path

    def ledger(self, rollout_id: str) -> list[dict[str, Any]]:
        return ledger_store(self.ledger_dir).read(rollout_id)

    def records(self, rollout_id: str) -> list[dict[str, Any]]:
        assert self.capture_dir is not None
        return CaptureStore(self.capture_dir).read(rollout_id)


@contextlib.asynccontextmanager
async def _stack(
    tmp_path: Path, *, capture: bool = True, ledger_dir: Path | None = None
) -> AsyncIterator[Stack]:
    staging_dir = tmp_path / "staging"
    capture_dir = tmp_path / "calls" if capture else None
    if ledger_dir is None:
        ledger_dir = tmp_path / "calls" if capture else tmp_path / "ledger"
    async with FakeUpstream(api_key=UPSTREAM_KEY) as upstream:
        worker = create_worker_app(
            WorkerSettings(upstream_url=upstream.url, staging_dir=staging_dir, api_key=UPSTREAM_KEY)
        )
        async with serving(worker) as worker_url:
            settings = ModelServerSettings(
                model_type="vllm_model",
                base_url=worker_url + "/v1",
                capture_dir=capture_dir,
                external_staging=True,
                ledger_dir=ledger_dir,
            )
            async with serving(create_model_app(settings)) as model_url:
                yield Stack(model_url, upstream, staging_dir, capture_dir, ledger_dir)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with _stack(tmp_path) as s:
        yield s


@contextlib.asynccontextmanager
async def _openai(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx2.AsyncClient() as http:
        yield openai.AsyncOpenAI(base_url=url, api_key=CLIENT_KEY, max_retries=0, http_client=http)


def _expected_chain(upstream: FakeUpstream) -> tuple[list[int], list[int], list[float]]:
    """The full ids, masks and logprobs of the rollout, from what the fake was asked and said."""
    chats = [r.json for r in upstream.requests if r.path == "/v1/chat/completions"]
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for request in chats:
        prompt = render_prompt(
            request["messages"], prefix_ids=request.get("required_prefix_token_ids")
        )
        assert prompt[: len(ids)] == ids, "the fake's prompt continues the chain"
        fresh = prompt[len(ids) :]
        ids += fresh
        mask += [0] * len(fresh)
        logprobs += [0.0] * len(fresh)
    return ids, mask, logprobs


def _generated(answer: dict[str, Any]) -> list[int]:
    return [*encode(assistant_body(answer)), END]


async def test_a_five_turn_tool_rollout_streamed_through_the_chat_sdk_is_one_exact_chain(
    stack: Stack,
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Pick A, four times."}]
    answers: list[dict[str, Any]] = []
    async with _openai(f"{stack.model_url}/ng-rollout/rl-1/v1") as client:
        for turn in range(5):
            async with client.chat.completions.stream(
                model="tool" if turn < 4 else "text",  # the fake's scenario, by model name
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS_CHAT,
            ) as stream:
                final = await stream.get_final_completion()  # the SDK accepted the stream
            message = final.choices[0].message
            answer: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                answer["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in message.tool_calls
                ]
            answers.append(answer)
            messages.append(answer)
            for call in answer.get("tool_calls", []):
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    assert all("tool_calls" in a for a in answers[:4])
    assert answers[4]["content"]

    # The worker was always asked for a complete answer, never a stream.
    chats = [r.json for r in stack.upstream.requests]
    assert len(chats) == 5
    assert all(c["stream"] is False and c["return_token_ids"] is True for c in chats)

    (chain,) = linearize(stack.staging_dir, "rl-1")
    assert len(chain.model_call_ids) == 5
    last_prompt = render_prompt(chats[-1]["messages"])
    assert list(chain.token_ids) == last_prompt + _generated(answers[-1])
    # Masks and logprobs: 1 and the fake's logprob over each turn's generated ids, else 0.
    expected_mask = [0] * len(chain.token_ids)
    expected_logprobs = [0.0] * len(chain.token_ids)
    for request, answer in zip(chats, answers, strict=True):
        start = len(render_prompt(request["messages"]))
        for i, token in enumerate(_generated(answer)):
            expected_mask[start + i] = 1
            expected_logprobs[start + i] = fake_logprob(token, i)
    assert list(chain.loss_mask) == expected_mask
    assert list(chain.logprobs) == expected_logprobs

    # The capture: five streamed records in call order; the ledger: five staged calls chained.
    records = stack.records("rl-1")
    assert [r["model_call_id"] for r in records] == list(chain.model_call_ids)
    assert all(r["response_raw"].startswith("data: ") for r in records)
    assert all(r["error_category"] is None and r["status_code"] == 200 for r in records)
    assert records[0]["response"]["choices"][0]["message"]["tool_calls"]
    ledger = stack.ledger("rl-1")
    assert [line["disposition"] for line in ledger] == ["staged"] * 5
    assert [line["parent_model_call_id"] for line in ledger] == [None, *chain.model_call_ids[:4]]
    for line in ledger:  # token-free
        assert set(line["coords"]) >= {"cum_len", "digest", "chain_hash"}
        assert "token_ids" not in orjson.dumps(line).decode()


async def test_responses_stream_and_messages_stream_are_staged_and_valid_for_the_sdks(
    stack: Stack,
) -> None:
    async with _openai(f"{stack.model_url}/ng-rollout/rl-r/v1") as client:
        history: list[Any] = [{"role": "user", "content": "Pick one."}]
        for turn in range(3):
            async with client.responses.stream(
                model="tool" if turn < 2 else "text", input=history, tools=TOOLS_RESPONSES
            ) as stream:
                response = await stream.get_final_response()
            assert response.status == "completed"
            for item in response.output:
                history.append(item.model_dump(mode="json", exclude_none=True))
                if item.type == "function_call":
                    history.append(
                        {"type": "function_call_output", "call_id": item.call_id, "output": "ok"}
                    )
        assert response.output_text
    (chain,) = linearize(stack.staging_dir, "rl-r")
    assert len(chain.model_call_ids) == 3
    ids, _, _ = _expected_chain(stack.upstream)
    assert list(chain.token_ids[: len(ids)]) == ids

    async with httpx2.AsyncClient() as http:
        claude = anthropic.AsyncAnthropic(
            base_url=f"{stack.model_url}/ng-rollout/rl-m",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
        )
        async with claude.messages.stream(
            model="tool",
            max_tokens=64,
            messages=[{"role": "user", "content": "Pick one."}],
            tools=TOOLS_MESSAGES,
        ) as stream:
            message = await stream.get_final_message()
    assert message.stop_reason == "tool_use"
    (chain,) = linearize(stack.staging_dir, "rl-m")
    assert len(chain.model_call_ids) == 1
    (record,) = stack.records("rl-m")
    assert record["dialect"] == "messages"
    assert record["response"]["content"][0]["type"] == "tool_use"


async def test_non_streamed_answers_lose_the_internal_token_fields(stack: Stack) -> None:
    async with _openai(f"{stack.model_url}/ng-rollout/rl-n/v1") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="text", messages=[{"role": "user", "content": "hi"}]
        )
    body = orjson.loads(raw.content)
    assert "prompt_token_ids" not in body
    assert COORDS_FIELD not in body
    assert "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"] is None  # the client did not ask for them
    assert raw.headers["x-rollcap-model-call-id"] == stack.ledger("rl-n")[0]["model_call_id"]


@pytest.mark.parametrize("include_usage", [True, False])
async def test_a_chat_stream_carries_usage_only_when_the_client_asked(
    stack: Stack, include_usage: bool
) -> None:
    body: dict[str, Any] = {"model": "text", "messages": [{"role": "user", "content": "hi"}]}
    body |= STREAM
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    url = f"{stack.model_url}/ng-rollout/rl-u/v1/chat/completions"
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as response,
    ):
        assert response.status == 200
        raw = await response.text()
    chunks = [
        orjson.loads(line[6:])
        for line in raw.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    with_usage = [c for c in chunks if c.get("usage")]
    assert len(with_usage) == (1 if include_usage else 0)
    if include_usage:  # the SDK reads it as the call's usage
        async with _openai(f"{stack.model_url}/ng-rollout/rl-u2/v1") as client:
            stream = await client.chat.completions.create(
                model="text",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            last = [chunk async for chunk in stream][-1]
        assert last.usage is not None
        assert last.usage.completion_tokens > 0


@pytest.mark.parametrize("capture", [True, False])
async def test_a_conversion_failure_is_recorded_then_the_responses_stream_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: bool
) -> None:
    def broken(dialect: str, response: Any) -> Any:
        raise ValueError("cannot serialize this answer")

    async with _stack(tmp_path, capture=capture) as stack:
        monkeypatch.setattr(_staged, "render_sse", broken)
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{stack.model_url}/ng-rollout/rl-f/v1/responses",
                json={"model": "text", "input": "hi", "stream": True},
            ) as resp:
                status = resp.status
                body = await resp.read()
            async with http.post(
                f"{stack.model_url}/ng-rollout/rl-f/v1/chat/completions",
                json={
                    "model": "text",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                },
            ) as resp:
                chat_status = resp.status
                chat_body = orjson.loads(await resp.read())
        ledger = stack.ledger("rl-f")
        records = stack.records("rl-f") if capture else []
    # A Responses client gets a stream that ends in response.failed; others a 500.
    assert status == 200
    assert b"event: response.failed" in body
    assert b"response.completed" not in body
    assert chat_status == 500
    assert "token capture failed" in chat_body["error"]["message"]
    # The ledger says so (written before the client heard), and no success record exists.
    assert [line["disposition"] for line in ledger] == ["capture_failed", "capture_failed"]
    assert all(line["reason"].startswith("conversion_failed") for line in ledger)
    assert all(line["served"] is False for line in ledger)
    if capture:
        assert len(records) == 2
        for record in records:
            assert record["status_code"] == 500
            assert record["error_category"] == "upstream_error"
            assert record["gaps"][0]["code"] == "token_capture_failed"
            # The worker answered; the client got the server's own failure instead.
            assert record["upstream_attempted"] is True
            assert record["upstream_status_code"] == 200
            assert record["response_source"] == "local"
            assert record["local_response_reason"] == "token_capture_failed"
    else:
        assert not (tmp_path / "calls").exists()


async def test_a_pinned_prefix_is_sent_as_given_and_continued_exactly(stack: Stack) -> None:
    pinned = render_prompt([{"role": "user", "content": "earlier, compacted"}])[:-3]
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{stack.model_url}/ng-rollout/rl-p/v1/responses",
            json={"model": "text", "input": "go on", "required_prefix_token_ids": pinned},
        ) as resp:
            assert resp.status == 200
            body = await resp.json()
        async with http.post(
            f"{stack.model_url}/ng-rollout/rl-p/v1/responses",
            json={"model": "text", "input": "go on", "required_prefix_token_ids": ["x"]},
        ) as resp:
            assert resp.status == 400
            assert "required_prefix_token_ids" in (await resp.json())["error"]["message"]
    assert body["status"] == "completed"
    (request,) = [r.json for r in stack.upstream.requests]
    assert request["required_prefix_token_ids"] == pinned
    (chain,) = linearize(stack.staging_dir, "rl-p")
    assert list(chain.token_ids[: len(pinned)]) == pinned


async def _refusing_worker(request: web.Request) -> web.Response:
    """A worker whose upstream did not honour the pinned ids: it fails the call closed."""
    admission = (await request.json())["ng_capture"]
    coords = CommitCoords.failed(
        "required_prefix_mismatch",
        "the prompt does not start with the pinned ids",
        rollout_id=admission["rollout_id"],
        model_call_id=admission["model_call_id"],
    )
    error = {
        "message": "the prompt does not start with the pinned ids",
        "type": "invalid_request_error",
        "param": None,
        "code": "required_prefix_mismatch",
    }
    return web.json_response({"error": error, COORDS_FIELD: coords.to_json()}, status=409)


async def test_a_pin_the_worker_cannot_honour_fails_closed(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _refusing_worker)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    settings = ModelServerSettings(
        model_type="vllm_model",
        base_url=f"http://127.0.0.1:{port}/v1",
        capture_dir=tmp_path,
        external_staging=True,
        ledger_dir=tmp_path,
    )
    try:
        async with serving(create_model_app(settings)) as url, aiohttp.ClientSession() as http:
            payload = {"model": "m", "input": "go", "required_prefix_token_ids": [5, 6]}
            async with http.post(
                f"{url}/ng-rollout/rl-x/v1/responses", json={**payload, "stream": True}
            ) as resp:
                streamed = (resp.status, await resp.read())
            async with http.post(f"{url}/ng-rollout/rl-x/v1/responses", json=payload) as resp:
                plain = (resp.status, await resp.json())
    finally:
        await runner.cleanup()
    assert streamed[0] == 200
    assert b"event: response.failed" in streamed[1]
    assert b"required_prefix_mismatch" in streamed[1]
    assert plain[0] == 409
    ledger = ledger_store(tmp_path).read("rl-x")
    assert [line["disposition"] for line in ledger] == ["capture_failed"] * 2
    assert ledger[0]["coords"]["reason"].startswith("required_prefix_mismatch")
    assert (tmp_path / f"rl-x{LEDGER_SUFFIX}").exists()


def test_external_staging_needs_vllm_model_and_a_ledger_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vllm_model"):
        ModelServerSettings(
            model_type="openai_model",
            base_url="http://x",
            external_staging=True,
            ledger_dir=tmp_path,
        )
    with pytest.raises(ValueError, match="ledger"):
        ModelServerSettings(model_type="vllm_model", base_url="http://x", external_staging=True)


async def test_the_openai_sdk_sees_the_failed_response_of_a_conversion_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(dialect: str, response: Any) -> Any:
        raise ValueError("cannot serialize this answer")

    async with _stack(tmp_path) as stack:
        monkeypatch.setattr(_staged, "render_sse", broken)
        async with _openai(f"{stack.model_url}/ng-rollout/rl-s/v1") as client:
            stream = await client.responses.create(model="text", input="hi", stream=True)
            kinds = [event.type async for event in stream]
    assert kinds == ["response.created", "response.failed"]


async def test_namespaced_tools_keep_one_identity_so_the_rollout_stays_one_chain(
    stack: Stack,
) -> None:
    tools: list[Any] = [
        {
            "type": "namespace",
            "name": "crm",
            "description": "customer records",
            "tools": [
                {
                    "type": "function",
                    "name": "lookup",
                    "description": "Look a customer up",
                    "parameters": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                }
            ],
        }
    ]
    history: list[Any] = [{"role": "user", "content": "Who is Ada?"}]
    async with _openai(f"{stack.model_url}/ng-rollout/rl-ns/v1") as client:
        for turn in range(3):
            async with client.responses.stream(
                model="tool" if turn < 2 else "text",
                input=history,
                tools=tools,
            ) as stream:
                response = await stream.get_final_response()
            for item in response.output:
                dumped = item.model_dump(mode="json", exclude_none=True)
                if item.type == "function_call":
                    # The client sees the call as it declared it: namespace plus name.
                    assert (dumped["namespace"], dumped["name"]) == ("crm", "lookup")
                history.append(dumped)
                if item.type == "function_call":
                    history.append(
                        {"type": "function_call_output", "call_id": item.call_id, "output": "ok"}
                    )
    # The backend saw one flattened name; the chain did not break between the two forms.
    chats = [r.json for r in stack.upstream.requests]
    assert chats[1]["messages"][1]["tool_calls"][0]["function"]["name"] == "crm__lookup"
    (chain,) = linearize(stack.staging_dir, "rl-ns")
    assert len(chain.model_call_ids) == 3
    assert [line["disposition"] for line in stack.ledger("rl-ns")] == ["staged"] * 3


async def test_a_ledger_that_cannot_be_written_never_fails_the_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the ledger directory should be")
    async with (
        _stack(tmp_path, capture=False, ledger_dir=blocked) as stack,
        _openai(f"{stack.model_url}/ng-rollout/rl-l/v1") as client,
    ):
        answer = await client.chat.completions.create(
            model="text", messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.choices[0].message.content  # served, and staged by the worker all the same
    (chain,) = linearize(tmp_path / "staging", "rl-l")
    assert len(chain.model_call_ids) == 1
    assert any("token ledger write failed" in r.getMessage() for r in caplog.records)
