"""The gate of RL token staging (``token_id_capture.external_staging``), as NeMo Gym 0.7.0's.

Only a training call (``/ng-rollout/<id>/training-token-capture/v1/...``) is staged; the
model server's upstream is then a capture worker in front of the inference engine. One
training call, in order (STAGING §9):

1. The client's request (any dialect, streamed or not) is read and validated like a
   non-streaming one; it becomes a chat request with ``stream: false``.
2. Its parent is resolved from the ledger (``staging._ledger``): no assistant-authored item is a
   root; exactly one committed row whose fingerprints match is the parent; anything else is
   ``unresolved_parent`` once the rollout has rows (it would train earlier generated tokens as
   prompt), a root before. An admitted call carries ``ng_capture`` to the worker; an unadmitted
   one goes without it and is still served.
3. The worker answers with ``ng_commit_coords``; the token fields are stripped and the answer
   becomes the client's dialect, keeping the worker's completion ``id`` (what terminal
   attribution joins on).
4. The whole answer is serialized (SSE events for a stream), then the coordinates are checked
   and the ledger row written, then the bytes go out. A call admitted but not committed gets
   ``request_finished_without_staged_coordinates``; the client's answer is served in every case
   but a conversion failure (``response.failed`` for a Responses stream, else a 500).

The capture middleware records the call (with the same ``model_call_id``) when it sees the
body, so with capture on the answer also waits for the durable evaluation record.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rollcap._json import load_json_object
from rollcap.dialects.chat import wants_stream_usage
from rollcap.records import GAP_TOKEN_CAPTURE_FAILED
from rollcap.routing import SCOPE_ROLLOUT_ID_KEY, SCOPE_TRAINING_KEY
from rollcap.server._answers import error_response, read_whole, upstream_error
from rollcap.server._fresh import new_model_call_id
from rollcap.server._middleware import request_body
from rollcap.server._recorder import CallFailure, CallRecorder, LocalReason
from rollcap.server._translating import CHAT_PATH, Translation
from rollcap.server._writer import RecordWriter
from rollcap.sse import SSEEvent, encode_event
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    FINGERPRINT_VERSION,
    LINEAGE_MARKER_SUFFIX,
    LINEAGE_SUFFIX,
    REASON_INVALID_WORKER_COMMIT_COORDINATES,
    REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    REASON_UNRESOLVED_PARENT,
    REASON_WORKER_CAPTURE_FAILED,
    REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES,
    CallRecord,
    CaptureAdmission,
    CaptureLedgerCommit,
    CommitCoords,
    FileLineageStore,
    assistant_fingerprint,
    bearer_matches,
    failure_row,
    ledger_row,
    output_fingerprints,
    prepare_engine_request,
    request_items,
    response_items,
    strip_capture_transport_fields,
)
from rollcap.store import CaptureStore
from rollcap.translate import chat_response_to_responses, render_sse

__all__ = ["StagedCalls"]

log = logging.getLogger("rollcap.server")


Opener = Callable[
    [Request, str, bytes, str | None, CallRecorder | None],
    Awaitable[aiohttp.ClientResponse | Response],
]


class _Refused(Exception):
    """The client's request cannot be served; the message says why (HTTP 400)."""


class _Broken(Exception):
    """The request items cannot be fingerprinted or resolved: the request fails (no admission)."""


@dataclass(slots=True)
class _Call:
    """One training call, from the client's request to the answer it gets."""

    dialect: str
    rollout_id: str
    model_call_id: str
    admitted_at: float
    client_request: dict[str, Any]
    streaming: bool
    translation: Translation | None
    chat_request: dict[str, Any]
    items: list[dict[str, Any]]
    admission: CaptureAdmission | None = None
    committed: bool = False


class StagedCalls:
    """The model server's side of external token staging (see the module docstring).

    ``ledger`` is the gate's durable, token-free ledger; ``backend`` the worker kind
    (``vllm_worker`` or ``megatron_worker``), which decides where the admission rides.
    """

    def __init__(self, ledger: FileLineageStore, *, backend: str = "vllm_worker") -> None:
        self.ledger = ledger
        self.backend = backend
        # Rows are appended the way capture records are: batched in one thread, each file
        # written then synced in overlapping lanes, under an exclusive flock on the ledger file
        # (which FileLineageStore's own appends take too). The gate mints every call id, so
        # each row is written once and needs no check against what is there.
        self.rows = RecordWriter(
            CaptureStore(ledger.root, suffix=LINEAGE_SUFFIX, marker_suffix=LINEAGE_MARKER_SUFFIX)
        )

    def close(self) -> None:
        """Stop the row writer and close the ledger files it keeps open (blocking)."""
        self.rows.close()
        self.rows.store.close()

    @staticmethod
    def scrub(body: bytes | bytearray) -> bytes | bytearray:
        """``body`` without an ``ng_capture`` a client wrote itself, for a call that is not a
        training call: only the gate admits. A body that cannot hold the key (no ``capture``,
        no escape that could spell it) is returned as it is, unparsed."""
        if b"capture" not in body and b"\\u" not in body:
            return body
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body  # the upstream answers it as the malformed request it is
        if not isinstance(parsed, dict) or CAPTURE_FIELD not in parsed:
            return body
        del parsed[CAPTURE_FIELD]
        return orjson.dumps(parsed)

    def applies(self, request: Request, dialect: str | None) -> bool:
        scope = request.scope
        return (
            dialect is not None
            and scope.get(SCOPE_ROLLOUT_ID_KEY) is not None
            and scope.get(SCOPE_TRAINING_KEY) is True
        )

    # -- the call ----------------------------------------------------------------------------

    async def forward(
        self,
        request: Request,
        dialect: str,
        recorder: CallRecorder | None,
        open_upstream: Opener,
    ) -> Response:
        try:
            call = self._read(request, dialect, await request_body(request), recorder)
        except _Refused as exc:
            if recorder is not None:
                recorder.answered_locally(LocalReason.INVALID_REQUEST)
            return error_response(dialect, 400, "invalid_request_error", str(exc))
        try:
            await self._admit(call)
        except _Broken as exc:
            log.error("training call %s/%s: %s", call.rollout_id, call.model_call_id, exc)
            return self._failed(call, recorder, str(exc))
        try:
            engine = prepare_engine_request(
                call.chat_request,
                None if call.admission is None else call.admission.model_dump(mode="json"),
                backend=self.backend,
            )
        except ValueError as exc:
            await self._finish(call)
            return self._failed(call, recorder, str(exc))
        try:
            return await self._served(call, request, recorder, open_upstream, engine)
        finally:
            await self._finish(call)

    async def _served(
        self,
        call: _Call,
        request: Request,
        recorder: CallRecorder | None,
        open_upstream: Opener,
        engine: dict[str, Any],
    ) -> Response:
        opened = await open_upstream(
            request, CHAT_PATH, orjson.dumps(engine), call.dialect, recorder
        )
        if isinstance(opened, Response):
            return opened
        upstream = opened
        raw = await read_whole(upstream, call.dialect, recorder)
        if isinstance(raw, Response):
            return raw
        if not 200 <= upstream.status < 300:
            return upstream_error(call.dialect, upstream.status, raw, recorder)
        answer = load_json_object(raw)
        if answer is None:
            if recorder is not None:
                recorder.answered_locally(LocalReason.UPSTREAM_ANSWER_INVALID)
            return error_response(
                call.dialect, 502, "api_error", "upstream answered with invalid JSON"
            )
        coords = answer.get(COORDS_FIELD)
        had_coords = COORDS_FIELD in answer
        try:
            client, body, media_type = self._convert(call, answer)
        except Exception as exc:
            # The client hears the exception's text (STAGING §9); the log names its type too.
            failure = str(exc) or type(exc).__name__
            log.error(
                "training call %s/%s: conversion failed: %s: %s",
                *self._names(call),
                type(exc).__name__,
                exc,
            )
            # The failure row is durable before the client hears of the failure.
            await self._finish(call)
            return self._failed(call, recorder, failure)
        if call.admission is not None:
            await self._finalize(call, had_coords, coords, client)
        return Response(body, status_code=upstream.status, media_type=media_type)

    # -- steps -------------------------------------------------------------------------------

    def _read(
        self, request: Request, dialect: str, raw: bytes | bytearray, recorder: CallRecorder | None
    ) -> _Call:
        try:
            client_request = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise _Refused(f"invalid request: the body is not JSON ({exc})") from None
        if not isinstance(client_request, dict):
            raise _Refused("invalid request: the body must be a JSON object")
        if "required_prefix_token_ids" in client_request:
            raise _Refused(
                "invalid request: required_prefix_token_ids is not accepted from a client on a "
                "training call: the gate resolves each call's prefix from its ledger"
            )
        model_call_id = recorder.model_call_id if recorder is not None else new_model_call_id()
        translation: Translation | None = None
        try:
            if dialect == "chat":
                chat = dict(client_request)
            else:
                translation = Translation(
                    dialect, client_request, answer_id=model_call_id, created=time.time()
                )
                chat = dict(translation.chat_request)
        except ValueError as exc:
            raise _Refused(f"invalid request: {exc}") from None
        chat.pop("stream", None)
        chat.pop("stream_options", None)
        # The admission is the gate's alone: a client's own never reaches the worker, so an
        # unadmitted call stays unstaged.
        chat.pop(CAPTURE_FIELD, None)
        return _Call(
            dialect=dialect,
            rollout_id=request.scope[SCOPE_ROLLOUT_ID_KEY],
            model_call_id=model_call_id,
            admitted_at=time.time(),
            client_request=client_request,
            streaming=client_request.get("stream") is True,
            translation=translation,
            chat_request=chat,
            items=[],
        )

    async def _admit(self, call: _Call) -> None:
        """Resolve the parent and build the admission, or record why there is none."""
        try:
            call.items = request_items(call.dialect, call.client_request)
            printed = assistant_fingerprint(call.items)
            parent = None
            if printed:
                parent = await anyio.to_thread.run_sync(
                    functools.partial(
                        self.ledger.resolve, call.rollout_id, call.items, fingerprint=printed
                    )
                )
                if parent is None and not await anyio.to_thread.run_sync(
                    self.ledger.has_rows, call.rollout_id
                ):
                    printed = ""  # a first call that replays history the ledger never saw
        except Exception as exc:
            # Unfingerprintable items, or a ledger that cannot be read: no parent can be known,
            # so the request fails rather than guess one (STAGING §1.2, §9).
            raise _Broken(f"the request items cannot be fingerprinted or resolved: {exc}") from exc
        if not printed:
            call.admission = CaptureAdmission(
                rollout_id=call.rollout_id, model_call_id=call.model_call_id, mode="text"
            )
            return
        if parent is not None:
            try:
                call.admission = CaptureAdmission(
                    rollout_id=call.rollout_id,
                    model_call_id=call.model_call_id,
                    parent_call_id=parent.model_call_id,
                    prev_len=parent.cum_len,
                    mode="token_in",
                    staging_chain=list(parent.staging_chain),
                    parent_chain_hash=parent.chain_hash,
                )
                return
            except ValueError as exc:
                log.error("training call %s/%s: parent row unusable: %s", *self._names(call), exc)
        await self._failure(call, REASON_UNRESOLVED_PARENT)

    def _convert(self, call: _Call, answer: dict[str, Any]) -> tuple[dict[str, Any], bytes, str]:
        chat = strip_capture_transport_fields(answer)
        served_id = chat.get("id")
        if call.translation is None:
            client = chat
        else:
            keep = served_id if isinstance(served_id, str) and served_id else None
            client = call.translation.answer(chat, served_id=keep)
        if not call.streaming:
            return client, orjson.dumps(client), "application/json"
        shown = client
        if call.dialect == "chat" and not wants_stream_usage(call.client_request):
            # A chat stream carries the usage chunk only when the client asked for it.
            shown = {key: value for key, value in client.items() if key != "usage"}
        events = render_sse(call.dialect, shown)
        body = b"".join(encode_event(e) for e in events)
        return client, body, "text/event-stream; charset=utf-8"

    async def _finalize(
        self,
        call: _Call,
        had_coords: bool,
        raw_coords: object,
        client: dict[str, Any],
    ) -> None:
        """Check the worker's coordinates and write the ledger row (STAGING §4.2)."""
        admission = call.admission
        assert admission is not None
        if not had_coords or raw_coords is None:
            await self._failure(call, REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES)
            return
        try:
            coords = CommitCoords.model_validate(raw_coords)
            if (coords.rollout_id, coords.model_call_id) != (call.rollout_id, call.model_call_id):
                raise ValueError(f"coordinates of another call: {coords.staging_key}")
        except ValueError as exc:
            log.error("training call %s/%s: bad coordinates: %s", *self._names(call), exc)
            await self._failure(call, REASON_INVALID_WORKER_COMMIT_COORDINATES)
            return
        if not coords.staged:
            await self._failure(call, REASON_WORKER_CAPTURE_FAILED)
            return
        try:
            if (coords.parent_call_id, coords.prev_len) != (
                admission.parent_call_id,
                admission.prev_len,
            ):
                raise ValueError("the coordinates' parent or prev_len differ from the admission")
            response_id = client.get("id")
            if not isinstance(response_id, str) or not response_id:
                raise ValueError("the served answer has no id")
            answer_items = response_items(call.dialect, client)
            output_print, continuation_print = output_fingerprints(call.items, answer_items)
            digest, extras_digest, key, chain_hash, cumulative_hash = _staged_columns(coords)
            record = CallRecord(
                model_call_id=coords.model_call_id,
                parent_call_id=coords.parent_call_id,
                prev_len=coords.prev_len,
                delta_len=coords.delta_len,
                cum_len=coords.cum_len,
                weight_version=coords.weight_version,
                digest=digest,
                extras_digest=extras_digest,
                staging_key=key,
                mode=admission.mode,
                chain_hash=chain_hash,
                cumulative_hash=cumulative_hash,
                response_id=response_id,
                admitted_at=call.admitted_at,
                output_fingerprint=output_print,
                continuation_fingerprint=continuation_print,
                fingerprint_version=FINGERPRINT_VERSION,
            )
            commit = CaptureLedgerCommit(
                rollout_id=call.rollout_id,
                record=record,
                staging_chain=[*admission.staging_chain, key],
                request_items=call.items,
                response_items=answer_items,
            )
            await self.rows.append(call.rollout_id, ledger_row(commit))
        except Exception as exc:
            log.error("training call %s/%s: not committed: %s", *self._names(call), exc)
            await self._failure(call, REASON_INVALID_WORKER_COMMIT_COORDINATES)
            return
        call.committed = True

    async def _finish(self, call: _Call) -> None:
        """An admitted call that was not committed says so, once."""
        if call.admission is not None and not call.committed:
            call.committed = True  # the row below is written once, whatever happens next
            await self._failure(call, REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES)

    async def _failure(self, call: _Call, reason: str) -> None:
        """A failure row; a ledger that cannot be written is logged, never raised to the call.

        Shielded: a call cancelled on its way (the server stopping) still leaves its row, or
        the trainer would take an uncommitted call for one that never was.
        """
        try:
            with anyio.CancelScope(shield=True):
                await self.rows.append(call.rollout_id, failure_row(call.model_call_id, reason))
        except Exception as exc:
            log.error(
                "token ledger: failure %s of %s/%s not written: %s",
                reason,
                *self._names(call),
                getattr(exc, "strerror", None) or exc,
            )

    @staticmethod
    def _names(call: _Call) -> tuple[str, str]:
        return call.rollout_id, call.model_call_id

    def _failed(self, call: _Call, recorder: CallRecorder | None, reason: str) -> Response:
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
        return error_response(call.dialect, 500, "api_error", f"token capture failed: {reason}")

    # -- the control route -------------------------------------------------------------------

    def manifest_route(self, token: str) -> Callable[[Request], Awaitable[Response]]:
        """``GET .../rollouts/{rollout_id}/manifest``: the rollout's manifest, bearer-protected."""

        async def manifest(request: Request) -> Response:
            if not bearer_matches(request.headers.get("authorization"), token):
                return JSONResponse(
                    {"detail": "missing or invalid control-plane bearer token"}, status_code=401
                )
            rollout_id = request.path_params["rollout_id"]
            try:
                found = await anyio.to_thread.run_sync(self.ledger.manifest, rollout_id)
            except ValueError as exc:
                return JSONResponse({"detail": str(exc)}, status_code=400)
            return Response(
                orjson.dumps(found.model_dump(mode="json")), media_type="application/json"
            )

        return manifest


def _staged_columns(coords: CommitCoords) -> tuple[str, str, str, str, str]:
    """``digest, extras_digest, staging_key, chain_hash, cumulative_hash`` of staged coords.

    ``CommitCoords`` validation already requires all five of a staged shape; checked again so
    that a row is never written with one missing.
    """
    columns = (
        coords.digest,
        coords.extras_digest,
        coords.staging_key,
        coords.chain_hash,
        coords.cumulative_hash,
    )
    digest, extras_digest, key, chain_hash, cumulative_hash = columns
    if (
        digest is None
        or extras_digest is None
        or key is None
        or chain_hash is None
        or cumulative_hash is None
    ):
        raise ValueError("staged coordinates without their digests and staging key")
    return digest, extras_digest, key, chain_hash, cumulative_hash


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
        "error": {"code": "server_error", "message": reason},
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
