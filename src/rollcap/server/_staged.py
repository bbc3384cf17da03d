"""Calls answered through a token-capture worker (``token_id_capture.external_staging``).

For RL the trainer needs the exact token ids of every call, which a capture worker in front of
the inference server stages (``rollcap.staging``). Such a call takes this way:

1. The client's request (any dialect, streamed or not) becomes a chat request with
   ``stream: false`` and an admission (``ng_capture``): the rollout, this call's id, and the
   parent call found from the conversation (``rollcap.conversation``), so a multi-turn rollout
   is one chain. A Responses request may pin ``required_prefix_token_ids`` (context compaction): the
   worker must continue from exactly those ids or fail the call.
2. The worker answers with the generation and its commit coordinates. They are checked against
   the admission and written, token-free, to the ledger (``<rollout_id>.tokens.jsonl`` under
   ``token_id_capture.ledger_dir``) before anything reaches the client.
3. Internal token fields are removed and the answer is converted to the client's dialect. A
   streaming client gets the whole answer serialized as SSE events first; the capture middleware
   records the call when it sees that body and only then lets it out, so the events are replayed
   after the record is durable. No content reaches the client during generation.
4. If converting or serializing fails, the ledger says so before the client hears of it, the
   capture record carries the failure (never a success), and the client gets a terminal
   ``response.failed`` event (Responses streams) or a 500 with an error body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from rollcap._json import load_json_object
from rollcap.conversation import ConversationIndex, answer_fingerprint, fingerprints
from rollcap.dialects.chat import wants_stream_usage
from rollcap.records import GAP_TOKEN_CAPTURE_FAILED
from rollcap.routing import SCOPE_ROLLOUT_ID_KEY
from rollcap.server._answers import error_response, read_whole, upstream_error
from rollcap.server._fresh import new_model_call_id
from rollcap.server._middleware import request_body
from rollcap.server._recorder import CallFailure, CallRecorder, LocalReason
from rollcap.server._translating import Translation
from rollcap.server._writer import RecordWriter
from rollcap.sse import SSEEvent, encode_event
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    REASON_REQUIRED_PREFIX_MISMATCH,
    Admission,
    CommitCoords,
    VLLMCaptureAdapter,
)
from rollcap.store import CaptureStore
from rollcap.translate import chat_response_to_responses, namespaced_tool_names, render_sse

__all__ = [
    "LEDGER_MARKER_SUFFIX",
    "LEDGER_SUFFIX",
    "PINNED_PREFIX_FIELD",
    "StagedCalls",
    "ledger_store",
]

log = logging.getLogger("rollcap.server")

LEDGER_SUFFIX = ".tokens.jsonl"
LEDGER_MARKER_SUFFIX = ".tokens.incomplete"
# A Responses client pins ids for context compaction under the same name the worker uses.
PINNED_PREFIX_FIELD = PREFIX_IDS_FIELD
CHAT_PATH = "/v1/chat/completions"

Opener = Callable[
    [Request, str, bytes, str | None, CallRecorder | None],
    Awaitable[aiohttp.ClientResponse | Response],
]


def ledger_store(directory: Path) -> CaptureStore:
    return CaptureStore(directory, suffix=LEDGER_SUFFIX, marker_suffix=LEDGER_MARKER_SUFFIX)


class _Refused(Exception):
    """The client's request cannot be staged; the message says why (HTTP 400)."""


@dataclass(slots=True)
class _Call:
    """One staged call, from the client's request to the answer it gets."""

    dialect: str
    rollout_id: str
    model_call_id: str
    client_request: dict[str, Any]
    streaming: bool
    translation: Translation | None
    chat_request: dict[str, Any]
    identities: dict[str, tuple[str, str]]
    parent: str | None
    pinned: list[int] | None
    prints: list[bytes]

    @property
    def staging_key(self) -> str:
        return f"{self.rollout_id}/{self.model_call_id}"


def _pinned_prefix(request: dict[str, Any]) -> list[int] | None:
    raw = request.pop(PINNED_PREFIX_FIELD, None)
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in raw
    ):
        raise _Refused(f"{PINNED_PREFIX_FIELD} must be a list of token ids (integers >= 0)")
    return raw


class StagedCalls:
    """The model server's side of external token staging (see the module docstring)."""

    def __init__(self, ledger: CaptureStore, *, max_rollouts: int = 4096) -> None:
        # The same durable appends, batched the same way, as the capture records.
        self.ledger = RecordWriter(ledger)
        self.conversations = ConversationIndex(max_rollouts)
        self.adapter = VLLMCaptureAdapter()

    def applies(self, request: Request, dialect: str | None) -> bool:
        return dialect is not None and request.scope.get(SCOPE_ROLLOUT_ID_KEY) is not None

    def _admit(
        self, request: Request, dialect: str, raw: bytes | bytearray, recorder: CallRecorder | None
    ) -> _Call:
        try:
            client_request = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _Refused(f"invalid request: the body is not JSON ({exc})") from None
        if not isinstance(client_request, dict):
            raise _Refused("invalid request: the body must be a JSON object")
        streaming = client_request.get("stream") is True
        outgoing = dict(client_request)
        pinned = _pinned_prefix(outgoing) if dialect == "responses" else None
        translation: Translation | None = None
        identities: dict[str, tuple[str, str]] = {}
        try:
            if dialect == "chat":
                chat = outgoing
            else:
                translation = Translation(
                    dialect, outgoing, answer_id=new_model_call_id(), created=time.time()
                )
                chat = dict(translation.chat_request)
                if dialect == "responses":
                    identities = namespaced_tool_names(outgoing)
        except ValueError as exc:
            raise _Refused(f"invalid request: {exc}") from None
        # The worker stages a complete answer; the client's stream is rebuilt from it.
        chat["stream"] = False
        chat.pop("stream_options", None)
        messages = chat.get("messages")
        prints = fingerprints(messages if isinstance(messages, list) else [], identities)
        rollout_id = request.scope[SCOPE_ROLLOUT_ID_KEY]
        call = _Call(
            dialect=dialect,
            rollout_id=rollout_id,
            model_call_id=recorder.model_call_id if recorder is not None else new_model_call_id(),
            client_request=client_request,
            streaming=streaming,
            translation=translation,
            chat_request=chat,
            identities=identities,
            parent=self.conversations.parent(rollout_id, prints),
            pinned=pinned,
            prints=prints,
        )
        chat[CAPTURE_FIELD] = Admission(
            rollout_id=call.rollout_id,
            model_call_id=call.model_call_id,
            parent_model_call_id=call.parent,
            required_prefix_token_ids=None if pinned is None else tuple(pinned),
        ).to_json()
        return call

    async def forward(
        self,
        request: Request,
        dialect: str,
        recorder: CallRecorder | None,
        open_upstream: Opener,
    ) -> Response:
        try:
            call = self._admit(request, dialect, await request_body(request), recorder)
        except _Refused as exc:
            if recorder is not None:
                recorder.answered_locally(LocalReason.INVALID_REQUEST)
            return error_response(dialect, 400, "invalid_request_error", str(exc))
        opened = await open_upstream(
            request, CHAT_PATH, orjson.dumps(call.chat_request), dialect, recorder
        )
        if isinstance(opened, Response):
            await self._ledger(call, None, "capture worker unreachable or too slow")
            return opened
        upstream = opened
        raw = await read_whole(upstream, dialect, recorder)
        if isinstance(raw, Response):
            await self._ledger(
                call, None, f"capture worker answer not read (HTTP {raw.status_code})"
            )
            return raw
        answer = load_json_object(raw)
        coords = self._coords(call, answer)
        if not 200 <= upstream.status < 300:
            refusal = f"capture worker answered HTTP {upstream.status}"
            if coords is not None and coords.reason:
                refusal = coords.reason
            await self._ledger(call, coords, refusal)
            if upstream.status == 409 and _is_prefix_mismatch(answer):
                # Pinned ids that cannot be honoured fail the call: never a re-tokenization.
                return self._failed(call, recorder, f"fails closed: {refusal}", status=409)
            return upstream_error(dialect, upstream.status, raw, recorder)
        if not isinstance(answer, dict):
            await self._ledger(call, None, "capture worker answered with invalid JSON")
            if recorder is not None:
                recorder.answered_locally(LocalReason.UPSTREAM_ANSWER_INVALID)
            return error_response(dialect, 502, "api_error", "upstream answered with invalid JSON")
        reason: str | None = None
        if coords is None:
            reason = "the capture worker returned no valid commit coordinates"
        elif not coords.staged:
            reason = coords.reason or "the capture worker could not stage the call"
        try:
            body, media_type = self._convert(call, answer)
        except Exception as exc:
            failure = f"conversion_failed: {type(exc).__name__}: {exc}"
            log.error("staged call %s: %s", call.staging_key, failure)
            await self._ledger(call, coords, failure, converted=False)
            return self._failed(call, recorder, failure, status=500)
        await self._ledger(call, coords, reason)
        if reason is None:
            message = _first_message(answer)
            if message is not None:
                self.conversations.remember(
                    call.rollout_id,
                    answer_fingerprint(call.prints, message, call.identities),
                    call.model_call_id,
                )
        return Response(body, status_code=upstream.status, media_type=media_type)

    def _coords(self, call: _Call, answer: object) -> CommitCoords | None:
        if not isinstance(answer, dict):
            return None
        raw = answer.get(COORDS_FIELD)
        if raw is None:
            return None
        try:
            coords = CommitCoords.from_json(raw)
        except ValueError as exc:
            log.error("staged call %s: bad commit coordinates: %s", call.staging_key, exc)
            return None
        if (coords.staging_key, coords.rollout_id, coords.model_call_id) != (
            call.staging_key,
            call.rollout_id,
            call.model_call_id,
        ):
            log.error(
                "staged call %s: the worker committed %s instead",
                call.staging_key,
                coords.staging_key,
            )
            return None
        return coords

    def _convert(self, call: _Call, answer: dict[str, Any]) -> tuple[bytes, str]:
        wants_logprobs = call.dialect == "chat" and bool(call.client_request.get("logprobs"))
        chat = self.adapter.strip(answer, keep_logprobs=wants_logprobs)
        client = chat if call.translation is None else call.translation.answer(chat)
        if not call.streaming:
            return orjson.dumps(client), "application/json"
        if call.dialect == "chat" and not wants_stream_usage(call.client_request):
            # A chat stream carries the usage chunk only when the client asked for it, as
            # upstream's own stream would.
            client = {key: value for key, value in client.items() if key != "usage"}
        events = render_sse(call.dialect, client)
        return b"".join(encode_event(e) for e in events), "text/event-stream; charset=utf-8"

    def _failed(
        self, call: _Call, recorder: CallRecorder | None, reason: str, *, status: int
    ) -> Response:
        if recorder is not None:
            recorder.answered_locally(LocalReason.TOKEN_CAPTURE_FAILED)
            recorder.fail(CallFailure.EXCEPTION)
            recorder.gap(GAP_TOKEN_CAPTURE_FAILED, reason)
        if call.dialect == "responses" and call.streaming:
            return Response(
                _response_failed(call, reason),
                status_code=200,
                media_type="text/event-stream; charset=utf-8",
            )
        return error_response(call.dialect, status, "api_error", f"token capture failed: {reason}")

    async def _ledger(
        self,
        call: _Call,
        coords: CommitCoords | None,
        failure: str | None,
        *,
        converted: bool = True,
    ) -> None:
        """One token-free line per call; a failed write is logged, never raised."""
        staged = coords is not None and coords.staged and failure is None and converted
        line: dict[str, Any] = {
            "model_call_id": call.model_call_id,
            "rollout_id": call.rollout_id,
            "staging_key": call.staging_key,
            "parent_model_call_id": call.parent,
            "disposition": "staged" if staged else "capture_failed",
            "reason": None if staged else failure,
            "served": converted,
            "coords": coords.to_json() if coords is not None else None,
            "recorded_at": time.time(),
        }
        try:
            await self.ledger.append(call.rollout_id, line)
        except Exception as exc:
            log.error(
                "token ledger write failed for %s: %s",
                call.staging_key,
                getattr(exc, "strerror", None) or exc,
            )
            try:
                await anyio.to_thread.run_sync(self.ledger.store.mark_incomplete, call.rollout_id)
            except Exception:
                log.error("could not leave the ledger's incomplete marker for %s", call.rollout_id)


def _first_message(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        message = choices[0].get("message")
        if isinstance(message, Mapping):
            return message
    return None


def _is_prefix_mismatch(answer: object) -> bool:
    if not isinstance(answer, Mapping):
        return False
    error = answer.get("error")
    return isinstance(error, Mapping) and error.get("code") == REASON_REQUIRED_PREFIX_MISMATCH


def _response_failed(call: _Call, reason: str) -> bytes:
    """A Responses stream that opens and fails: what an SDK reads as a failed response.

    Built by hand, not by the renderer: it is what goes out when rendering itself failed.
    """
    response_id = f"resp_{call.model_call_id}"
    try:
        response = chat_response_to_responses(
            {}, call.client_request, response_id=response_id, created_at=time.time()
        )
    except Exception:
        response = {"id": response_id, "object": "response", "created_at": time.time()}
    opened = {**response, "status": "in_progress", "output": [], "usage": None, "error": None}
    failed = {
        **opened,
        "status": "failed",
        "error": {"code": "server_error", "message": f"token capture failed: {reason}"},
    }
    events = [
        (
            "response.created",
            {"type": "response.created", "sequence_number": 0, "response": opened},
        ),
        ("response.failed", {"type": "response.failed", "sequence_number": 1, "response": failed}),
    ]
    return b"".join(
        encode_event(SSEEvent(data=orjson.dumps(data).decode(), event=name))
        for name, data in events
    )
