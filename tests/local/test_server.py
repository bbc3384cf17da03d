"""End to end on the embedded model: a capturing ``local_model`` model server, three SDKs."""

from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest

from rollcap import CaptureStore, ModelCallRecord, read_model_call_records
from rollcap.local import MODEL_ID, LocalEngine
from tests.local.conftest import LocalModelServer

QUESTION = "What is 2+2? Answer with a number."  # the model ends its answer by itself


def _only_record(server: LocalModelServer, rollout_id: str) -> ModelCallRecord:
    (record,) = read_model_call_records(CaptureStore(server.capture_dir), rollout_id)
    assert record.error_category is None
    assert record.status_code == 200
    assert isinstance(record.tokens_in, int)
    assert isinstance(record.tokens_out, int)
    assert record.tokens_in > 0
    assert record.tokens_out > 0
    return record


async def test_responses_and_messages_clients_on_the_embedded_model(
    local_model_server: LocalModelServer, engine: LocalEngine
) -> None:
    base = local_model_server.url
    async with httpx2.AsyncClient(timeout=60) as http:
        oai = openai.AsyncOpenAI(
            base_url=f"{base}/ng-rollout/local-r1/v1",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )
        created = await oai.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=64)
        oai_stream = openai.AsyncOpenAI(
            base_url=f"{base}/ng-rollout/local-r2/v1",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )
        async with oai_stream.responses.stream(
            model=MODEL_ID, input=QUESTION, max_output_tokens=64
        ) as stream:
            streamed = await stream.get_final_response()
        ant = anthropic.AsyncAnthropic(
            base_url=f"{base}/ng-rollout/local-m1",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )
        message = await ant.messages.create(
            model=MODEL_ID,
            max_tokens=64,
            messages=[{"role": "user", "content": QUESTION}],
        )
        health = (await http.get(f"{base}/health")).json()

    assert created.output_text
    assert streamed.output_text == created.output_text  # greedy: the same answer either way
    assert message.content[0].type == "text"
    assert message.content[0].text

    first = _only_record(local_model_server, "local-r1")
    assert first.dialect == "responses"
    assert first.response_id == created.id
    # The model read exactly the translated request: one user message through the template.
    prompt = engine.prompt([{"role": "user", "content": QUESTION}])
    assert first.tokens_in == len(prompt.tokens)
    assert created.usage is not None
    assert first.tokens_out == created.usage.output_tokens
    second = _only_record(local_model_server, "local-r2")
    assert second.response_raw is not None  # the raw SSE, kept for a streamed call
    assert (second.tokens_in, second.tokens_out) == (first.tokens_in, first.tokens_out)
    third = _only_record(local_model_server, "local-m1")
    assert third.dialect == "messages"
    assert third.tokens_in == first.tokens_in
    assert health["model_type"] == "local_model"


async def test_chat_clients_pass_through_to_the_embedded_model(
    local_model_server: LocalModelServer,
) -> None:
    async with httpx2.AsyncClient(timeout=60) as http:
        client = openai.AsyncOpenAI(
            base_url=f"{local_model_server.url}/ng-rollout/local-c1/v1",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )
        answer = await client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}], max_tokens=8
        )
        models = await client.models.list()
    assert answer.choices[0].message.content
    assert [m.id for m in models.data] == [MODEL_ID]
    record = _only_record(local_model_server, "local-c1")
    assert record.dialect == "chat"
    assert answer.usage is not None
    assert record.tokens_out == answer.usage.completion_tokens


async def test_a_prompt_too_long_for_the_embedded_model_is_context_length_exceeded(
    local_model_server: LocalModelServer,
) -> None:
    # The embedded model refuses with OpenAI's code; the Messages client gets Anthropic's shape,
    # which has no code, and the record still says why.
    async with httpx2.AsyncClient(timeout=60) as http:
        ant = anthropic.AsyncAnthropic(
            base_url=f"{local_model_server.url}/ng-rollout/local-long",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )
        with pytest.raises(anthropic.BadRequestError):
            await ant.messages.create(
                model=MODEL_ID,
                max_tokens=8,
                messages=[{"role": "user", "content": "word " * 9000}],
            )
    (record,) = read_model_call_records(CaptureStore(local_model_server.capture_dir), "local-long")
    assert record.error_category == "context_length_exceeded"
    assert (record.upstream_attempted, record.response_source, record.upstream_status_code) == (
        True,
        "upstream",
        400,
    )
    assert record.local_response_reason is None


async def test_a_websocket_conversation_on_the_embedded_model(
    local_model_server: LocalModelServer, engine: LocalEngine
) -> None:
    # Two turns over one socket, the second continuing the first by previous_response_id:
    # the server holds the state, and the embedded model answers the whole conversation.
    client = openai.AsyncOpenAI(
        base_url=f"{local_model_server.url}/ng-rollout/local-ws1/v1",
        api_key="unused",
        max_retries=0,
    )
    answers: list[str] = []
    async with client.responses.connect() as connection:
        previous: str | None = None
        for question in (QUESTION, "And 3+3? Answer with a number."):
            await connection.response.create(
                model=MODEL_ID,
                input=question,
                max_output_tokens=32,
                previous_response_id=previous,
            )
            async for event in connection:
                if event.type == "response.completed":
                    previous = event.response.id
                    answers.append(event.response.output_text)
                    break
    await client.close()
    records = read_model_call_records(CaptureStore(local_model_server.capture_dir), "local-ws1")
    assert len(records) == 2
    for record in records:
        assert (record.status_code, record.error_category) == (200, None)
        assert isinstance(record.tokens_in, int)
    # The second call's prompt held the first turn too: more input tokens than its own words.
    assert records[1].tokens_in is not None
    assert records[0].tokens_in is not None
    assert records[1].tokens_in > records[0].tokens_in
    raws = CaptureStore(local_model_server.capture_dir).read("local-ws1")
    assert [r["transport"] for r in raws] == ["websocket", "websocket"]
    assert raws[1]["request"]["previous_response_id"] == raws[0]["response"]["id"]
    assert [r["response"]["output"][0]["content"][0]["text"] for r in raws] == answers
