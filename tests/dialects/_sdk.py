"""What the official SDKs build from a raw stream, through their own stream helpers.

Each call sends one request through the SDK's client, answered by an in-process transport with the
stream's exact bytes, and returns the SDK's final object as JSON (``to_dict(mode="json")``): the
reference the differential test holds our reassembly to.
"""

from __future__ import annotations

import warnings
from typing import Any

import anthropic
import httpx2
import openai

__all__ = ["DERIVED_KEYS", "NoReference", "sdk_final", "without_filled_nulls"]

# Keys the SDKs compute on their own (structured-output parsing), never sent by a server.
DERIVED_KEYS = frozenset({"parsed", "parsed_arguments", "parsed_output"})

_BASE_URL = "http://sdk.invalid"


class NoReference(Exception):
    """The SDK refuses the stream: it raised one of its own errors for it."""


def _http(raw: bytes) -> httpx2.Client:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=raw)

    return httpx2.Client(transport=httpx2.MockTransport(answer))


def sdk_final(dialect: str, raw: bytes) -> dict[str, Any]:
    """The SDK's final object for ``raw``, a stream of ``dialect``; raises ``NoReference`` where
    the SDK cannot finish the stream (an error event, no ``response.completed``)."""
    try:
        return _final(dialect, raw)
    except (openai.APIError, anthropic.APIError) as exc:  # an error event
        raise NoReference(str(exc)) from exc
    except RuntimeError as exc:
        if "response.completed" not in str(exc):
            raise
        raise NoReference(str(exc)) from exc


def _final(dialect: str, raw: bytes) -> dict[str, Any]:
    if dialect == "messages":
        claude = anthropic.Anthropic(
            api_key="sdk-test", base_url=_BASE_URL, http_client=_http(raw), max_retries=0
        )
        # The beta helper is the richer accumulation (context management, compaction), and
        # the one Claude Code's SDK runs.
        with claude.beta.messages.stream(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
        ) as stream:
            final = stream.get_final_message()
        with warnings.catch_warnings():
            # A block of a type the SDK does not know still serializes, with a warning.
            warnings.simplefilter("ignore")
            return final.to_dict(mode="json")
    client = openai.OpenAI(
        api_key="sdk-test", base_url=f"{_BASE_URL}/v1", http_client=_http(raw), max_retries=0
    )
    if dialect == "responses":
        with client.responses.stream(model="m", input="x") as responses:
            return responses.get_final_response().to_dict(mode="json")
    with client.chat.completions.stream(
        model="m", messages=[{"role": "user", "content": "x"}]
    ) as chat:
        try:
            return chat.get_final_completion().to_dict(mode="json")
        except (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError) as exc:
            # The final completion refuses a cut answer; the accumulation it refuses is the
            # same object, and what a caller of the stream holds.
            completion: Any = exc.completion
            return dict(completion.to_dict(mode="json"))


def without_filled_nulls(value: Any, raw: bytes) -> Any:
    """``value`` without the nulls an SDK fills in for keys the stream ``raw`` never names (the
    anthropic SDK sets ``stop_details`` from a ``message_delta`` that has none): the same answer
    as the key left out, which is what a record keeps."""
    if isinstance(value, dict):
        return {
            key: without_filled_nulls(item, raw)
            for key, item in value.items()
            if item is not None or f'"{key}"'.encode() in raw
        }
    if isinstance(value, list):
        return [without_filled_nulls(item, raw) for item in value]
    return value
