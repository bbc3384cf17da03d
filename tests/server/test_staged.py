"""token_id_capture.external_staging: SDK clients, the gate, a capture worker, the fake engine.

The stack runs on real sockets, in the order of STAGING §0::

    client (openai / anthropic SDK) -> model server (the gate) -> hop -> capture worker
        -> hop -> FakeUpstream (the engine)

Each hop passes every call on as it came and keeps what it was sent and what it got back; a test
may rewrite an answer in a hop, to play a worker or an engine that misbehaves. The trainer's
side is the library's: the manifest over the control route (``RolloutControlClient``), a receipt
(``attribute_and_receive``), base snapshots from the worker's staging directory, and
``verify_and_linearize``. What it rebuilds is compared with a chain computed independently from
what the fake engine was asked and answered (its byte-level tokenizer, ``rollcap.testing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import openai
import orjson
import pytest
from aiohttp import web
from openai.types.responses import ResponseCreatedEvent, ResponseFailedEvent

from rollcap._runtime.serving import serving
from rollcap.config import TokenCaptureSettings
from rollcap.server import ModelServerSettings, _staged, create_model_app
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    DEFAULT_CONTROL_TOKEN_ENV,
    PREFIX_IDS_FIELD,
    REASON_INVALID_WORKER_COMMIT_COORDINATES,
    REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    REASON_UNRESOLVED_PARENT,
    REASON_WORKER_CAPTURE_FAILED,
    REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES,
    DirectoryStagingSink,
    FileLineageStore,
    ReceiptVerificationError,
    RolloutControlClient,
    RolloutManifest,
    StagedCallBaseSnapshot,
    attribute_and_receive,
    receipt_for,
    verify_and_linearize,
)
from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream, assistant_body, encode, fake_logprob, render_prompt
from rollcap.worker import WorkerSettings, create_worker_app
from tests.server.conftest import CLIENT_KEY, UPSTREAM_KEY
from tests.server.test_sdks import TOOLS_CHAT, TOOLS_MESSAGES, TOOLS_RESPONSES

CONTROL_TOKEN = "control-plane-token-for-tests-4f1d"
END_ID = 2  # the fake tokenizer's end of a message
TOOL_TURNS = 4  # tool calls before the answer: a rollout of TOOL_TURNS + 1 calls
ROLLOUT_HEADERS = {"x-fake-scenario": "tool_turns", "x-fake-tool-turns": str(TOOL_TURNS)}
TRANSPORT_KEYS = (
    "prompt_token_ids",
    "token_ids",
    "generation_token_ids",
    "generation_log_probs",
    COORDS_FIELD,
)
HOP_DROP = frozenset({"host", "content-length", "transfer-encoding", "connection"})
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}

Rewrite = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


# -- the stack -------------------------------------------------------------------------------


@dataclass
class Exchange:
    """One call through a hop: the JSON body it was sent and the JSON answer it got back
    (``None`` for anything but a 200 JSON answer), before any rewrite."""

    request: dict[str, Any]
    answer: dict[str, Any] | None


@dataclass
class Hop:
    """An HTTP hop on a real socket: passes each call on to ``target`` and keeps it."""

    target: str
    calls: list[Exchange] = field(default_factory=list)
    rewrite: Rewrite | None = None  # applied to a 200 JSON answer before it goes back
    url: str = ""
    _session: aiohttp.ClientSession | None = None

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_DROP}
        assert self._session is not None
        async with self._session.request(
            request.method, self.target + request.path_qs, data=raw, headers=headers
        ) as upstream:
            data = await upstream.read()
            status = upstream.status
            content_type = upstream.headers.get("content-type", "application/json")
        if not isinstance(body, dict):
            return web.Response(body=data, status=status, headers={"content-type": content_type})
        answer = orjson.loads(data) if status == 200 and "json" in content_type else None
        self.calls.append(Exchange(body, answer))
        if answer is not None and self.rewrite is not None:
            data = orjson.dumps(self.rewrite(body, answer))
        return web.Response(body=data, status=status, headers={"content-type": content_type})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Hop]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._pass)
        runner = web.AppRunner(app, access_log=None)
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            self._session = session
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                yield self
            finally:
                await runner.cleanup()


@dataclass
class Stack:
    url: str  # the model server
    fake: FakeUpstream
    worker: Hop  # gate -> worker: the admissions and the coords
    engine: Hop  # worker -> engine: the prompts, pinned prefixes and the engine's answers
    staging_dir: Path
    ledger_dir: Path
    capture_dir: Path | None
    gate: contextlib.AsyncExitStack  # the model server's serving, to stop it early

    def training(self, rollout_id: str) -> str:
        return f"{self.url}/ng-rollout/{rollout_id}/training-token-capture"

    def plain(self, rollout_id: str) -> str:
        return f"{self.url}/ng-rollout/{rollout_id}"

    async def manifest(self, rollout_id: str) -> RolloutManifest:
        async with RolloutControlClient(
            self.url, auth_token=CONTROL_TOKEN, request_timeout_s=10.0
        ) as control:
            return await control.manifest(rollout_id)

    def snapshots(self, manifest: RolloutManifest) -> list[StagedCallBaseSnapshot]:
        sink = DirectoryStagingSink(self.staging_dir)
        return sink.fetch([row.staging_key for row in manifest.records])

    def staged_keys(self, rollout_id: str) -> list[str]:
        return DirectoryStagingSink(self.staging_dir).rollout_keys(rollout_id)

    def captured(self, rollout_id: str) -> list[dict[str, Any]]:
        assert self.capture_dir is not None
        return CaptureStore(self.capture_dir).read(rollout_id)


def staging_settings(
    worker_url: str, ledger_dir: Path, capture_dir: Path | None = None, **extra: Any
) -> ModelServerSettings:
    return ModelServerSettings(
        model_type="vllm_model",
        base_url=worker_url + "/v1",
        capture_dir=capture_dir,
        token_capture=TokenCaptureSettings(
            enabled=True, external_staging=True, dir=ledger_dir, **extra
        ),
    )


@contextlib.asynccontextmanager
async def _stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, capture: bool = True
) -> AsyncIterator[Stack]:
    monkeypatch.setenv(DEFAULT_CONTROL_TOKEN_ENV, CONTROL_TOKEN)
    staging_dir = tmp_path / "staging"
    ledger_dir = tmp_path / "ledger"
    capture_dir = tmp_path / "calls" if capture else None
    async with FakeUpstream(api_key=UPSTREAM_KEY) as fake, Hop(fake.url).running() as engine:
        worker_app = create_worker_app(
            WorkerSettings(upstream_url=engine.url, staging_dir=staging_dir, api_key=UPSTREAM_KEY)
        )
        async with serving(worker_app) as worker_url, Hop(worker_url).running() as worker:
            settings = staging_settings(worker.url, ledger_dir, capture_dir)
            async with contextlib.AsyncExitStack() as gate:
                url = await gate.enter_async_context(serving(create_model_app(settings)))
                yield Stack(url, fake, worker, engine, staging_dir, ledger_dir, capture_dir, gate)


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    async with _stack(tmp_path, monkeypatch) as s:
        yield s


@contextlib.asynccontextmanager
async def _openai(
    base: str, headers: dict[str, str] | None = None
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx2.AsyncClient(timeout=30.0) as http:
        yield openai.AsyncOpenAI(
            base_url=base + "/v1",
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
            default_headers=headers,
        )


@contextlib.asynccontextmanager
async def _anthropic(
    base: str, headers: dict[str, str] | None = None
) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with httpx2.AsyncClient(timeout=30.0) as http:
        yield anthropic.AsyncAnthropic(
            base_url=base,
            api_key=CLIENT_KEY,
            max_retries=0,
            http_client=http,
            default_headers=headers,
        )


# -- what the rebuilt row must be --------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    token_ids: list[int]
    token_mask: list[float]
    logprobs: list[float]
    carries: list[int]  # per call: the prompt ids new since its parent


def expected_chain(calls: list[Exchange]) -> Chain:
    """The rollout's ids, masks and logprobs, from what the fake engine was asked and answered.

    Each prompt is rendered by the fake's tokenizer from the messages and the pinned prefix it
    was sent; it must continue the chain so far (a continuation is pinned to exactly the ids
    before it, a root to nothing). The generated ids are the answer's body, then the end id.
    """
    ids: list[int] = []
    mask: list[float] = []
    logprobs: list[float] = []
    carries: list[int] = []
    for call in calls:
        assert call.answer is not None
        pinned = call.request.get(PREFIX_IDS_FIELD)
        assert pinned == (ids or None), "a continuation is pinned to the chain before it"
        prompt = render_prompt(call.request["messages"], prefix_ids=pinned)
        assert call.answer["prompt_token_ids"] == prompt
        assert prompt[: len(ids)] == ids
        carry = prompt[len(ids) :]
        generated = [*encode(assistant_body(call.answer["choices"][0]["message"])), END_ID]
        ids += carry + generated
        mask += [0.0] * len(carry) + [1.0] * len(generated)
        logprobs += [0.0] * len(carry) + [fake_logprob(t, i) for i, t in enumerate(generated)]
        carries.append(len(carry))
    return Chain(ids, mask, logprobs, carries)


def assert_chained(manifest: RolloutManifest, admissions: list[dict[str, Any]]) -> None:
    """Rows root to leaf, each the child of the one before; the admissions the worker got say
    the same, with the parent's staging chain and chain hash."""
    rows = manifest.records
    assert len(admissions) == len(rows)
    for index, (row, admission) in enumerate(zip(rows, admissions, strict=True)):
        assert admission["model_call_id"] == row.model_call_id
        assert admission["rollout_id"] == manifest.rollout_id
        assert admission["required_prefix_token_ids"] == []
        assert row.staging_key == f"{manifest.rollout_id}/{row.model_call_id}"
        if index == 0:
            assert (row.parent_call_id, row.prev_len, row.mode) == (None, 0, "text")
            assert admission["mode"] == "text"
            assert admission["staging_chain"] == []
            assert admission["parent_chain_hash"] is None
            continue
        parent = rows[index - 1]
        assert row.parent_call_id == parent.model_call_id
        assert row.prev_len == parent.cum_len
        assert row.mode == "token_in"
        assert admission["mode"] == "token_in"
        assert admission["parent_call_id"] == parent.model_call_id
        assert admission["prev_len"] == parent.cum_len
        assert admission["staging_chain"] == [r.staging_key for r in rows[:index]]
        assert admission["parent_chain_hash"] == parent.chain_hash


def assert_no_transport(answer: dict[str, Any]) -> None:
    text = orjson.dumps(answer).decode()
    for key in TRANSPORT_KEYS:
        assert f'"{key}"' not in text, key


# -- the rollouts, one per client --------------------------------------------------------------


async def chat_rollout(base: str, *, calls: int = TOOL_TURNS + 1) -> list[dict[str, Any]]:
    """A tool rollout through the Chat SDK's stream helper; the served answers, as dicts."""
    messages: list[Any] = [{"role": "user", "content": "Pick A, four times."}]
    served: list[dict[str, Any]] = []
    async with _openai(base, ROLLOUT_HEADERS) as client:
        for _ in range(calls):
            async with client.chat.completions.stream(
                model="fake-model", messages=messages, tools=TOOLS_CHAT, logprobs=True
            ) as stream:
                final = await stream.get_final_completion()
            served.append(final.model_dump(mode="json"))
            message = final.choices[0].message
            assert final.choices[0].logprobs is None  # asked for, never given
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
            messages.append(answer)
            for call in answer.get("tool_calls", []):
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    return served


async def responses_rollout(base: str, *, calls: int = TOOL_TURNS + 1) -> list[dict[str, Any]]:
    """A tool rollout through the Responses SDK's stream helper."""
    history: list[Any] = [{"role": "user", "content": "Pick A, four times."}]
    served: list[dict[str, Any]] = []
    async with _openai(base, ROLLOUT_HEADERS) as client:
        for _ in range(calls):
            async with client.responses.stream(
                model="fake-model", input=history, tools=TOOLS_RESPONSES
            ) as stream:
                response = await stream.get_final_response()
            assert response.status == "completed"
            served.append(response.model_dump(mode="json"))
            for item in response.output:
                history.append(item.model_dump(mode="json", exclude_none=True))
                if item.type == "function_call":
                    history.append(
                        {"type": "function_call_output", "call_id": item.call_id, "output": "ok"}
                    )
    return served


async def messages_rollout(
    base: str, *, streamed: bool, calls: int = TOOL_TURNS + 1
) -> list[dict[str, Any]]:
    """A tool rollout through the Anthropic SDK, streamed (its stream helper) or not."""
    messages: list[Any] = [{"role": "user", "content": "Pick A, four times."}]
    served: list[dict[str, Any]] = []
    async with _anthropic(base, ROLLOUT_HEADERS) as client:
        for _ in range(calls):
            message: anthropic.types.Message
            if streamed:
                async with client.messages.stream(
                    model="fake-model", max_tokens=256, messages=messages, tools=TOOLS_MESSAGES
                ) as stream:
                    message = await stream.get_final_message()
            else:
                message = await client.messages.create(
                    model="fake-model", max_tokens=256, messages=messages, tools=TOOLS_MESSAGES
                )
            served.append(message.model_dump(mode="json"))
            content = [
                block.model_dump(mode="json", exclude_none=True) for block in message.content
            ]
            messages.append({"role": "assistant", "content": content})
            results = [
                {"type": "tool_result", "tool_use_id": block["id"], "content": "ok"}
                for block in content
                if block["type"] == "tool_use"
            ]
            if results:
                messages.append({"role": "user", "content": results})
    return served


Rollout = Callable[[str], Awaitable[list[dict[str, Any]]]]


def _tool_calls(answer: dict[str, Any]) -> int:
    """How many tool calls a served answer makes, in whichever dialect it is."""
    if "choices" in answer:
        return len(answer["choices"][0]["message"].get("tool_calls") or [])
    if "output" in answer:
        return sum(1 for item in answer["output"] if item["type"] == "function_call")
    return sum(1 for block in answer["content"] if block["type"] == "tool_use")


ROLLOUTS: dict[str, Rollout] = {
    "chat-streamed": chat_rollout,
    "responses-streamed": responses_rollout,
    "messages-streamed": functools.partial(messages_rollout, streamed=True),
    "messages-plain": functools.partial(messages_rollout, streamed=False),
}


# -- 1, 2, 5: a whole rollout ------------------------------------------------------------------


@pytest.mark.parametrize("client", sorted(ROLLOUTS))
async def test_a_tool_rollout_is_staged_call_by_call_and_rebuilds_to_the_engines_exact_tokens(
    stack: Stack, client: str
) -> None:
    rollout_id = f"rl-{client}"
    served = await ROLLOUTS[client](stack.training(rollout_id))
    assert [_tool_calls(answer) for answer in served] == [1] * TOOL_TURNS + [0]

    # Every call went to the worker admitted, asking for a complete answer and token ids.
    sent = [call.request for call in stack.worker.calls]
    assert len(sent) == TOOL_TURNS + 1
    for body in sent:
        assert body["stream"] is False
        assert "stream_options" not in body
        assert body["logprobs"] is True
        assert body["top_logprobs"] == 0
        assert body["return_tokens_as_token_ids"] is True
        assert set(body[CAPTURE_FIELD]) == {
            "schema_version",
            "rollout_id",
            "model_call_id",
            "parent_call_id",
            "prev_len",
            "mode",
            "required_prefix_token_ids",
            "staging_chain",
            "parent_chain_hash",
        }

    # The trainer's side: the manifest over the control route, chained rows, no failures.
    manifest = await stack.manifest(rollout_id)
    assert manifest.rollout_id == rollout_id
    assert manifest.failures == []
    assert len(manifest.records) == TOOL_TURNS + 1
    assert_chained(manifest, [body[CAPTURE_FIELD] for body in sent])
    assert sorted(stack.staged_keys(rollout_id)) == sorted(r.staging_key for r in manifest.records)

    # The served answers keep the worker's completion id, the row's response id; no token
    # transport field reaches the client.
    for answer, row in zip(served, manifest.records, strict=True):
        assert answer["id"].startswith("chatcmpl-")
        assert answer["id"] == row.response_id
        assert_no_transport(answer)
    worker_ids = [call.answer["id"] for call in stack.worker.calls if call.answer is not None]
    assert [a["id"] for a in served] == worker_ids

    # The receipt joins the final served answer to the last call; the rebuilt row is exactly
    # what the fake engine saw and produced.
    receipt = attribute_and_receive(manifest, response=served[-1])
    assert receipt.capture_poisoned is False
    assert receipt.terminal_model_call_id == manifest.records[-1].model_call_id
    assert receipt.terminal_selection == "response_id"
    rebuilt = verify_and_linearize(receipt, stack.snapshots(manifest))
    chain = expected_chain(stack.engine.calls)
    assert rebuilt.token_ids == chain.token_ids
    assert rebuilt.token_mask == chain.token_mask
    assert rebuilt.logprobs == chain.logprobs
    assert all(type(value) is float for value in rebuilt.token_mask)
    assert rebuilt.model_call_ids == [r.model_call_id for r in manifest.records]
    assert rebuilt.prompt_len == chain.carries[0]
    assert [span[1] for span in rebuilt.link_spans] == chain.carries

    # Evaluation capture: one record per call, under the call's model_call_id.
    records = stack.captured(rollout_id)
    assert [r["model_call_id"] for r in records] == rebuilt.model_call_ids
    assert all(r["status_code"] == 200 and r["error_category"] is None for r in records)


async def test_the_last_answer_can_be_declared_instead_of_witnessed(stack: Stack) -> None:
    served = await chat_rollout(stack.training("rl-declared"), calls=2)
    manifest = await stack.manifest("rl-declared")
    terminal = manifest.records[-1].model_call_id
    receipt = receipt_for(manifest, terminal_model_call_id=terminal, terminal_selection="declared")
    row = verify_and_linearize(receipt, stack.snapshots(manifest))
    assert row.token_ids == expected_chain(stack.engine.calls).token_ids
    # The declared-response-id witness agrees.
    declared = attribute_and_receive(manifest, declared_response_id=served[-1]["id"])
    assert declared.terminal_model_call_id == terminal
    assert declared.terminal_selection == "declared"


# -- 2: what the client sees, byte for byte ----------------------------------------------------


def _body(dialect: str, *, stream: bool, **extra: Any) -> dict[str, Any]:
    if dialect == "chat":
        body: dict[str, Any] = {
            "model": "fake-model",
            "messages": [{"role": "user", "content": "hi"}],
        }
    elif dialect == "responses":
        body = {"model": "fake-model", "input": "hi"}
    else:
        body = {
            "model": "fake-model",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
        }
    return {**body, "stream": stream, **extra}


async def _post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, str, bytes, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            url,
            data=orjson.dumps(body),
            headers={"content-type": "application/json", **(headers or {})},
        ) as response,
    ):
        return (
            response.status,
            response.headers.get("content-type", ""),
            await response.read(),
            dict(response.headers),
        )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", sorted(ROUTES))
async def test_no_token_transport_field_reaches_the_client_and_the_id_is_the_workers(
    stack: Stack, dialect: str, stream: bool
) -> None:
    rollout_id = f"rl-raw-{dialect}-{int(stream)}"
    extra = {"logprobs": True, "top_logprobs": 2} if dialect == "chat" else {}
    status, content_type, raw, headers = await _post(
        stack.training(rollout_id) + ROUTES[dialect], _body(dialect, stream=stream, **extra)
    )
    assert status == 200
    assert content_type.startswith("text/event-stream" if stream else "application/json")
    for key in TRANSPORT_KEYS:
        assert f'"{key}"'.encode() not in raw, key
    (call,) = stack.worker.calls
    assert call.answer is not None
    assert call.answer["prompt_token_ids"]  # the worker had them; the client never did
    assert call.answer[COORDS_FIELD]["disposition"] == "staged"
    worker_id = call.answer["id"]
    assert worker_id.startswith("chatcmpl-")
    assert worker_id.encode() in raw
    if not stream:
        answer = orjson.loads(raw)
        assert answer["id"] == worker_id
        if dialect == "chat":
            assert "logprobs" not in answer["choices"][0]  # asked for, stripped
    manifest = await stack.manifest(rollout_id)
    (row,) = manifest.records
    assert row.response_id == worker_id
    assert headers["x-rollcap-model-call-id"] == row.model_call_id


async def test_a_chat_client_that_asked_for_logprobs_gets_none(stack: Stack) -> None:
    async with _openai(stack.training("rl-logprobs")) as client:
        answer = await client.chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            logprobs=True,
            top_logprobs=3,
        )
    assert answer.choices[0].logprobs is None
    assert answer.choices[0].message.content
    # The engine was asked for its logprobs all the same: they are the training data.
    (call,) = stack.engine.calls
    assert call.answer is not None
    assert call.answer["choices"][0]["logprobs"]["content"]


# -- 3: a plain prefixed call ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", sorted(ROUTES))
async def test_a_plain_rollout_call_is_served_and_stages_nothing(
    stack: Stack, dialect: str, stream: bool
) -> None:
    status, _, raw, headers = await _post(
        stack.plain("rl-plain") + ROUTES[dialect], _body(dialect, stream=stream)
    )
    assert status == 200
    assert raw
    (call,) = stack.worker.calls
    assert CAPTURE_FIELD not in call.request
    assert stack.engine.calls[0].request.get("return_token_ids") is None
    manifest = await stack.manifest("rl-plain")
    assert (manifest.records, manifest.failures) == ([], [])
    assert stack.staged_keys("rl-plain") == []
    assert not FileLineageStore(stack.ledger_dir).path("rl-plain").exists()
    # Evaluation capture still records it.
    (record,) = stack.captured("rl-plain")
    assert record["model_call_id"] == headers["x-rollcap-model-call-id"]


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
@pytest.mark.parametrize("spelled", ["ng_capture", "ng\\u005fcapture"])
async def test_an_admission_a_client_wrote_on_a_plain_call_never_reaches_the_worker(
    stack: Stack, dialect: str, spelled: str
) -> None:
    forged = {"schema_version": 2, "rollout_id": "rl-forge", "model_call_id": "f", "mode": "text"}
    body = orjson.dumps(_body(dialect, stream=False))
    raw_body = body[:-1] + b',"' + spelled.encode() + b'":' + orjson.dumps(forged) + b"}"
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            stack.plain("rl-forge") + ROUTES[dialect],
            data=raw_body,
            headers={"content-type": "application/json"},
        ) as answer,
    ):
        assert answer.status == 200
    (call,) = stack.worker.calls
    assert CAPTURE_FIELD not in call.request
    assert stack.staged_keys("rl-forge") == []


# -- the control route -------------------------------------------------------------------------


async def test_the_control_route_wants_the_exact_bearer_token(stack: Stack) -> None:
    await chat_rollout(stack.training("rl-ctl"), calls=1)
    url = f"{stack.url}/training-token-capture/control/rollouts/rl-ctl/manifest"
    refused = {"detail": "missing or invalid control-plane bearer token"}
    async with aiohttp.ClientSession() as http:
        for headers in (
            {},
            {"authorization": "Bearer wrong-token"},
            {"authorization": f"bearer {CONTROL_TOKEN}"},
            {"authorization": CONTROL_TOKEN},
            {"authorization": f"Bearer {CONTROL_TOKEN}x"},
        ):
            async with http.get(url, headers=headers) as response:
                assert response.status == 401, headers
                assert await response.json() == refused
        good = {"authorization": f"Bearer {CONTROL_TOKEN}"}
        async with http.get(url, headers=good) as response:
            assert response.status == 200
            manifest = RolloutManifest.model_validate(await response.json())
        assert len(manifest.records) == 1
        bad = f"{stack.url}/training-token-capture/control/rollouts/bad%20id/manifest"
        async with http.get(bad, headers=good) as response:
            assert response.status == 400
            assert await response.json() == {"detail": "Invalid rollout id: 'bad id'"}
        unknown = f"{stack.url}/training-token-capture/control/rollouts/never-seen/manifest"
        async with http.get(unknown, headers=good) as response:
            assert response.status == 200
            assert await response.json() == {
                "schema_version": 2,
                "rollout_id": "never-seen",
                "records": [],
                "failures": [],
            }
    async with RolloutControlClient(
        stack.url, auth_token="wrong-token", request_timeout_s=10.0
    ) as control:
        with pytest.raises(RuntimeError, match="401"):
            await control.manifest("rl-ctl")
    # The token lives in the environment only: nothing the stack wrote holds it.
    for path in stack.ledger_dir.parent.rglob("*"):
        if path.is_file():
            assert CONTROL_TOKEN.encode() not in path.read_bytes(), path


# -- 6: no token, no server ------------------------------------------------------------------


def test_the_server_refuses_to_start_without_the_control_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = staging_settings("http://127.0.0.1:9", tmp_path / "ledger")
    monkeypatch.delenv(DEFAULT_CONTROL_TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=DEFAULT_CONTROL_TOKEN_ENV):
        create_model_app(settings)
    monkeypatch.setenv(DEFAULT_CONTROL_TOKEN_ENV, "")
    with pytest.raises(ValueError, match=DEFAULT_CONTROL_TOKEN_ENV):
        create_model_app(settings)
    # Another variable, when configured so; the default one is then not read.
    own = staging_settings(
        "http://127.0.0.1:9", tmp_path / "ledger", control_auth_token_env="MY_CONTROL_TOKEN"
    )
    monkeypatch.setenv(DEFAULT_CONTROL_TOKEN_ENV, CONTROL_TOKEN)
    monkeypatch.delenv("MY_CONTROL_TOKEN", raising=False)
    with pytest.raises(ValueError, match="MY_CONTROL_TOKEN"):
        create_model_app(own)
    monkeypatch.setenv("MY_CONTROL_TOKEN", CONTROL_TOKEN)
    create_model_app(own)
    # Without external staging no token is needed.
    monkeypatch.delenv(DEFAULT_CONTROL_TOKEN_ENV)
    create_model_app(ModelServerSettings(model_type="vllm_model", base_url="http://127.0.0.1:9"))


# -- 4: failures -------------------------------------------------------------------------------


def _admitted(hop: Hop) -> list[str]:
    """The model call ids of the admitted calls the worker got, in order."""
    return [
        c.request[CAPTURE_FIELD]["model_call_id"] for c in hop.calls if CAPTURE_FIELD in c.request
    ]


def _failures(manifest: RolloutManifest) -> list[tuple[str, str]]:
    return [(f.model_call_id, f.reason) for f in manifest.failures]


def _assert_poisoned(
    stack: Stack, manifest: RolloutManifest, reason: str, served: dict[str, Any]
) -> None:
    """Whatever the trainer makes of a rollout with a failure, it never trains: attributed
    or declared, its receipt is poisoned and refused, with every staged row at hand."""
    snapshots = stack.snapshots(manifest)
    receipts = [attribute_and_receive(manifest, response=served)]
    if manifest.records:
        receipts.append(
            receipt_for(
                manifest,
                terminal_model_call_id=manifest.records[-1].model_call_id,
                terminal_selection="declared",
            )
        )
    for receipt in receipts:
        assert receipt.capture_poisoned is True
        assert receipt.failure_reason == reason
        with pytest.raises(ReceiptVerificationError) as refused:
            verify_and_linearize(receipt, snapshots)
        assert refused.value.code == "rollout_failed"
        assert str(refused.value) == f"rollout_failed: {reason}"


def _continuations(rewrite: Rewrite) -> Rewrite:
    """``rewrite`` applied to the answers of continuations only (their admission is token_in,
    or, engine-side, they are pinned to a prefix)."""

    def apply(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        capture = request.get(CAPTURE_FIELD)
        if PREFIX_IDS_FIELD in request and (capture is None or capture["mode"] == "token_in"):
            return rewrite(request, answer)
        return answer

    return apply


def _without(key: str) -> Rewrite:
    return lambda request, answer: {k: v for k, v in answer.items() if k != key}


DRIVERS: dict[str, Rollout] = {
    "chat-streamed": functools.partial(chat_rollout, calls=2),
    "responses-streamed": functools.partial(responses_rollout, calls=2),
    "messages-plain": functools.partial(messages_rollout, streamed=False, calls=2),
}


@pytest.mark.parametrize("client", sorted(DRIVERS))
async def test_a_worker_capture_failure_serves_the_answer_and_poisons_the_rollout(
    stack: Stack, client: str
) -> None:
    # The engine leaves the prompt ids out of its second answer: the worker cannot stage it.
    stack.engine.rewrite = _continuations(_without("prompt_token_ids"))
    rollout_id = f"rl-cf-{client}"
    served = await DRIVERS[client](stack.training(rollout_id))
    assert len(served) == 2
    assert served[1]["id"].startswith("chatcmpl-")  # a normal answer
    assert_no_transport(served[1])
    root, failed = _admitted(stack.worker)
    second = stack.worker.calls[1].answer
    assert second is not None
    assert second[COORDS_FIELD]["disposition"] == "capture_failed"
    assert second[COORDS_FIELD]["staging_key"] is None

    manifest = await stack.manifest(rollout_id)
    assert [r.model_call_id for r in manifest.records] == [root]
    assert _failures(manifest) == [
        (failed, REASON_WORKER_CAPTURE_FAILED),
        (failed, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES),
    ]
    assert stack.staged_keys(rollout_id) == [f"{rollout_id}/{root}"]
    _assert_poisoned(stack, manifest, REASON_WORKER_CAPTURE_FAILED, served[-1])
    # The client was served normally, and the capture says so.
    assert [r["status_code"] for r in stack.captured(rollout_id)] == [200, 200]


def _other_calls_coords() -> Rewrite:
    """A worker that answers the second call with the first call's coordinates."""
    first: list[dict[str, Any]] = []

    def rewrite(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if not first:
            first.append(answer[COORDS_FIELD])
            return answer
        return {**answer, COORDS_FIELD: first[0]}

    return rewrite


def _shifted(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """Well-formed staged coordinates of the right call that start one token late."""
    coords = dict(answer[COORDS_FIELD])
    coords["prev_len"] += 1
    coords["cum_len"] += 1
    return {**answer, COORDS_FIELD: coords}


def _coords(value: object) -> Rewrite:
    return lambda request, answer: {**answer, COORDS_FIELD: value}


@pytest.mark.parametrize(
    ("case", "rewrite", "reason"),
    [
        ("absent", _without(COORDS_FIELD), REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES),
        ("null", _coords(None), REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES),
        ("another-call", None, REASON_INVALID_WORKER_COMMIT_COORDINATES),
        ("shifted", _continuations(_shifted), REASON_INVALID_WORKER_COMMIT_COORDINATES),
        (
            "not-coords",
            _coords({"disposition": "staged"}),
            REASON_INVALID_WORKER_COMMIT_COORDINATES,
        ),
        ("a-string", _coords("staged"), REASON_INVALID_WORKER_COMMIT_COORDINATES),
    ],
)
async def test_coordinates_the_gate_cannot_use_leave_the_call_uncommitted_and_served(
    stack: Stack, case: str, rewrite: Rewrite | None, reason: str
) -> None:
    if rewrite is None:
        rewrite = _other_calls_coords()
    elif case != "shifted":
        rewrite = _continuations(rewrite)
    stack.worker.rewrite = rewrite
    rollout_id = f"rl-coords-{case}"
    served = await chat_rollout(stack.training(rollout_id), calls=2)
    assert served[1]["choices"][0]["message"]["tool_calls"]  # the normal answer
    assert_no_transport(served[1])
    root, second = _admitted(stack.worker)
    manifest = await stack.manifest(rollout_id)
    assert [r.model_call_id for r in manifest.records] == [root]
    assert _failures(manifest) == [
        (second, reason),
        (second, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES),
    ]
    _assert_poisoned(stack, manifest, reason, served[-1])


async def test_an_unresolved_continuation_is_served_and_stages_nothing(stack: Stack) -> None:
    served = await chat_rollout(stack.training("rl-unres"), calls=1)
    message = served[0]["choices"][0]["message"]
    replay = {
        "role": "assistant",
        "content": message["content"],
        "tool_calls": message["tool_calls"],
    }
    call_id = message["tool_calls"][0]["id"]
    # The first user turn rewritten: the answer is replayed, but after another conversation;
    # the client's own admission is not taken either.
    forged = {**stack.worker.calls[0].request[CAPTURE_FIELD], "model_call_id": "f" * 32}
    body: dict[str, Any] = {
        CAPTURE_FIELD: forged,
        "model": "fake-model",
        "messages": [
            {"role": "user", "content": "Pick B, four times."},
            replay,
            {"role": "tool", "tool_call_id": call_id, "content": "ok"},
        ],
        "tools": TOOLS_CHAT,
    }
    status, _, raw, headers = await _post(
        stack.training("rl-unres") + ROUTES["chat"], body, ROLLOUT_HEADERS
    )
    assert status == 200
    answer = orjson.loads(raw)
    assert answer["choices"][0]["message"]["tool_calls"]
    assert CAPTURE_FIELD not in stack.worker.calls[1].request  # not admitted
    assert PREFIX_IDS_FIELD not in stack.worker.calls[1].request
    manifest = await stack.manifest("rl-unres")
    (root,) = manifest.records
    assert _failures(manifest) == [(headers["x-rollcap-model-call-id"], REASON_UNRESOLVED_PARENT)]
    assert stack.staged_keys("rl-unres") == [root.staging_key]
    _assert_poisoned(stack, manifest, REASON_UNRESOLVED_PARENT, answer)

    # The same replay, untouched, resolves: only the rewritten turn broke the lineage.
    del body[CAPTURE_FIELD]
    body["messages"][0] = {"role": "user", "content": "Pick A, four times."}
    status, _, _, _ = await _post(
        stack.training("rl-unres") + ROUTES["chat"], body, ROLLOUT_HEADERS
    )
    assert status == 200
    assert stack.worker.calls[2].request[CAPTURE_FIELD]["parent_call_id"] == root.model_call_id


async def test_a_continuation_of_a_rollout_with_only_failures_is_unresolved(stack: Stack) -> None:
    # The root is served but not staged; the rollout has rows (its failures) from then on.
    stack.engine.rewrite = _without("prompt_token_ids")
    served = await chat_rollout(stack.training("rl-failed-root"), calls=2)
    assert len(served) == 2
    (root,) = _admitted(stack.worker)
    manifest = await stack.manifest("rl-failed-root")
    assert manifest.records == []
    second = stack.captured("rl-failed-root")[1]["model_call_id"]
    assert _failures(manifest) == [
        (root, REASON_WORKER_CAPTURE_FAILED),
        (root, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES),
        (second, REASON_UNRESOLVED_PARENT),
    ]


async def test_a_first_call_that_replays_history_the_ledger_never_saw_is_a_root(
    stack: Stack,
) -> None:
    history = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    async with _openai(stack.training("rl-replay")) as client:
        answer = await client.chat.completions.create(model="fake-model", messages=history)  # type: ignore[arg-type]
    manifest = await stack.manifest("rl-replay")
    assert manifest.failures == []
    (row,) = manifest.records
    assert (row.mode, row.parent_call_id, row.prev_len) == ("text", None, 0)
    assert row.response_id == answer.id
    receipt = attribute_and_receive(manifest, response=answer.model_dump(mode="json"))
    rebuilt = verify_and_linearize(receipt, stack.snapshots(manifest))
    chain = expected_chain(stack.engine.calls)
    # The replayed assistant turn is prompt: mask 0, never trained.
    assert rebuilt.token_ids == chain.token_ids
    assert rebuilt.token_mask == chain.token_mask
    assert rebuilt.prompt_len == len(render_prompt(history))
    assert rebuilt.logprobs == chain.logprobs


def _broken_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(answer: Any) -> Any:
        raise ValueError("cannot convert this answer")

    monkeypatch.setattr(_staged, "strip_capture_transport_fields", broken)


def _slow_failure_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failure rows take a while to become durable: an answer sent before its row would be
    seen without it."""
    original = FileLineageStore.record_failure

    def slow(self: FileLineageStore, rollout_id: str, model_call_id: str, reason: str) -> None:
        time.sleep(0.3)
        original(self, rollout_id, model_call_id, reason)

    monkeypatch.setattr(FileLineageStore, "record_failure", slow)


async def test_a_conversion_failure_on_a_responses_stream_fails_the_response_after_its_row(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    _broken_conversion(monkeypatch)
    _slow_failure_rows(monkeypatch)
    ledger = FileLineageStore(stack.ledger_dir)
    url = stack.training("rl-conv") + ROUTES["responses"]
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=_body("responses", stream=True)) as response,
    ):
        # What the client hears first, its headers, comes after the row is durable.
        assert _failures(ledger.manifest("rl-conv")) == [
            (
                response.headers["x-rollcap-model-call-id"],
                REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
            )
        ]
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = await response.read()
    assert b"response.completed" not in raw
    assert ledger.manifest("rl-conv").records == []

    # The SDK reads it as a response that opened, then failed.
    async with _openai(stack.training("rl-conv-sdk")) as client:
        stream = await client.responses.create(model="fake-model", input="hi", stream=True)
        events = [event async for event in stream]
    assert [e.type for e in events] == ["response.created", "response.failed"]
    created, failed = events
    assert isinstance(created, ResponseCreatedEvent)
    assert isinstance(failed, ResponseFailedEvent)
    assert created.response.status == "in_progress"
    assert failed.response.status == "failed"
    assert failed.response.id == created.response.id
    assert failed.response.id.startswith("resp_")
    assert failed.response.error is not None
    assert failed.response.error.code == "server_error"
    assert "cannot convert this answer" in failed.response.error.message
    (record,) = stack.captured("rl-conv-sdk")
    assert record["local_response_reason"] == "token_capture_failed"
    manifest = await stack.manifest("rl-conv-sdk")
    assert (manifest.records, _failures(manifest)) == (
        [],
        [(record["model_call_id"], REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)],
    )


@pytest.mark.parametrize(
    ("dialect", "stream"),
    [
        ("chat", False),
        ("chat", True),
        ("responses", False),
        ("messages", False),
        ("messages", True),
    ],
)
async def test_a_conversion_failure_elsewhere_is_a_500_after_its_row(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, dialect: str, stream: bool
) -> None:
    _broken_conversion(monkeypatch)
    _slow_failure_rows(monkeypatch)
    ledger = FileLineageStore(stack.ledger_dir)
    rollout_id = f"rl-conv-{dialect}-{int(stream)}"
    url = stack.training(rollout_id) + ROUTES[dialect]
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=_body(dialect, stream=stream)) as response,
    ):
        assert _failures(ledger.manifest(rollout_id)) == [
            (
                response.headers["x-rollcap-model-call-id"],
                REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
            )
        ]
        assert response.status == 500
        body = await response.json()
    assert "cannot convert this answer" in orjson.dumps(body).decode()
    assert ledger.manifest(rollout_id).records == []


async def test_items_that_cannot_be_fingerprinted_fail_the_request_without_a_row(
    stack: Stack,
) -> None:
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"text": "an untyped part"}]},
            {"role": "user", "content": "go on"},
        ],
    }
    status, _, raw, _ = await _post(stack.training("rl-unprintable") + ROUTES["chat"], body)
    assert status == 500
    assert b"fingerprint" in raw
    assert stack.worker.calls == []  # never asked
    manifest = await stack.manifest("rl-unprintable")
    assert (manifest.records, manifest.failures) == ([], [])


# -- without evaluation capture --------------------------------------------------------------


async def test_staging_without_evaluation_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _stack(tmp_path, monkeypatch, capture=False) as stack:
        served = await messages_rollout(stack.training("rl-nocap"), streamed=True, calls=3)
        manifest = await stack.manifest("rl-nocap")
        assert_chained(manifest, [c.request[CAPTURE_FIELD] for c in stack.worker.calls])
        receipt = attribute_and_receive(manifest, response=served[-1])
        row = verify_and_linearize(receipt, stack.snapshots(manifest))
        assert row.token_ids == expected_chain(stack.engine.calls).token_ids
    assert not (tmp_path / "calls").exists()


async def test_an_engine_error_reaches_the_client_and_leaves_the_call_uncommitted(
    stack: Stack,
) -> None:
    async with _openai(stack.training("rl-engine-500"), {"x-fake-scenario": "http_500"}) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}]
            )
    (admitted,) = _admitted(stack.worker)
    assert stack.worker.calls[0].answer is None  # the worker passed the engine's error on
    manifest = await stack.manifest("rl-engine-500")
    assert manifest.records == []
    assert _failures(manifest) == [(admitted, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_ledger_that_cannot_resolve_fails_the_request_without_a_row(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    def unreadable(self: FileLineageStore, rollout_id: str, items: Any, **_: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(FileLineageStore, "resolve", unreadable)
    body = {
        "model": "fake-model",
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "go on"},
        ],
        "stream": stream,
    }
    status, _, raw, _ = await _post(stack.training("rl-no-ledger") + ROUTES["responses"], body)
    if stream:
        assert status == 200
        assert b"event: response.failed" in raw
        assert b"Input/output error" in raw
    else:
        assert status == 500
    assert stack.worker.calls == []
    manifest = await stack.manifest("rl-no-ledger")
    assert (manifest.records, manifest.failures) == ([], [])


async def test_a_fresh_question_in_a_rollout_with_rows_is_another_root(stack: Stack) -> None:
    await chat_rollout(stack.training("rl-roots"), calls=2)
    async with _openai(stack.training("rl-roots")) as client:
        await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "Another question."}]
        )
    manifest = await stack.manifest("rl-roots")
    assert manifest.failures == []
    first, child, other = manifest.records
    assert child.parent_call_id == first.model_call_id
    assert (other.parent_call_id, other.mode, other.prev_len) == (None, "text", 0)


async def test_a_compacted_context_is_staged_as_0_7_0_makes_it_never_as_a_cut_child(
    stack: Stack,
) -> None:
    # An agent that compacts its context replaces the history with a summary. With no assistant
    # item left, the call is a new root (text) whose row rebuilds on its own; with one left that
    # no row matches, it is unresolved and poisons the rollout. Never a child whose prefix cuts
    # into its parent's, which rebuild refuses (parent_length_mismatch).
    await chat_rollout(stack.training("rl-compact"), calls=2)
    summary: list[Any] = [
        {"role": "user", "content": "Summary of the work so far: A was picked twice."},
        {"role": "user", "content": "Go on."},
    ]
    async with _openai(stack.training("rl-compact")) as client:
        compacted = await client.chat.completions.create(model="fake-model", messages=summary)
    manifest = await stack.manifest("rl-compact")
    assert manifest.failures == []
    *_, root = manifest.records
    assert (root.parent_call_id, root.mode, root.prev_len) == (None, "text", 0)
    receipt = attribute_and_receive(manifest, declared_response_id=compacted.id)
    assert receipt.terminal_model_call_id == root.model_call_id
    row = verify_and_linearize(receipt, stack.snapshots(manifest))
    assert row.model_call_ids == [root.model_call_id]
    assert row.token_ids[: row.prompt_len] == render_prompt(summary)[: row.prompt_len]

    kept: list[Any] = [
        *summary,
        {"role": "assistant", "content": "I picked A."},
        {"role": "user", "content": "More."},
    ]
    async with _openai(stack.training("rl-compact")) as client:
        await client.chat.completions.create(model="fake-model", messages=kept)
    manifest = await stack.manifest("rl-compact")
    assert [failure.reason for failure in manifest.failures] == [REASON_UNRESOLVED_PARENT]
    with pytest.raises(ReceiptVerificationError, match=r"^rollout_failed: unresolved_parent"):
        verify_and_linearize(attribute_and_receive(manifest), stack.snapshots(manifest))


async def test_a_call_cut_short_by_the_server_stopping_still_leaves_its_failure_row(
    stack: Stack,
) -> None:
    url = stack.training("rl-stop") + ROUTES["chat"]
    pending = asyncio.ensure_future(
        _post(url, _body("chat", stream=False), {"x-fake-scenario": "hang"})
    )
    async with asyncio.timeout(10):
        while not stack.fake.requests:  # the engine holds the call
            await asyncio.sleep(0.01)
    # The model server stops with the call in flight (cancelled after its grace period).
    await stack.gate.aclose()
    await stack.fake.stop()
    with contextlib.suppress(aiohttp.ClientError):
        await pending
    manifest = FileLineageStore(stack.ledger_dir).manifest("rl-stop")
    assert manifest.records == []
    assert [f.reason for f in manifest.failures] == [
        REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES
    ]
