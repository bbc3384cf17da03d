"""What the worker says on the wire, decided without I/O: admissions in, bodies out.

Wire: the client (the model server) sends a chat request with an admission in ``ng_capture``;
upstream gets the request without it, asking for token ids and logprobs (and pinning the
prompt's first ids when the admission does); the client gets the upstream's JSON unchanged
plus ``ng_commit_coords``. A pinned prefix the prompt does not start with fails closed (409).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rollcap._json import json_type_name
from rollcap.dialects import openai_error
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    REASON_REQUIRED_PREFIX_MISMATCH,
    Admission,
    CommitCoords,
    VLLMCaptureAdapter,
)

__all__ = [
    "Refusal",
    "fails_closed",
    "prefix_mismatch_body",
    "read_admission",
    "upstream_request",
    "with_coords",
]


class Refusal(Exception):
    """A captured request the worker refuses before anything goes upstream (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(openai_error(str(self), param=self.param))


def read_admission(body: Mapping[str, Any]) -> Admission:
    """The admission of a request that carries ``ng_capture``; ``Refusal`` naming the field
    when the request cannot be captured as sent."""
    if body.get("stream"):
        raise Refusal(
            f'"stream": true cannot be combined with {CAPTURE_FIELD}: the capture worker stages '
            "complete answers only, so streaming with external capture is unsupported; send "
            '"stream": false',
            "stream",
        )
    raw = body[CAPTURE_FIELD]
    if not isinstance(raw, Mapping):
        raise Refusal(
            f"{CAPTURE_FIELD} must be a JSON object, not {json_type_name(raw)}", CAPTURE_FIELD
        )
    try:
        admission = Admission.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise Refusal(f"invalid {CAPTURE_FIELD}: {exc}", CAPTURE_FIELD) from None
    pinned_in_body = body.get(PREFIX_IDS_FIELD)
    pinned = admission.required_prefix_token_ids
    if pinned_in_body is not None and (
        pinned is None or not isinstance(pinned_in_body, list) or tuple(pinned_in_body) != pinned
    ):
        # The capture checks the prompt against the admission's pin only; a different pin
        # in the body would have upstream generate from ids the capture never checks.
        raise Refusal(
            f"{PREFIX_IDS_FIELD} in the request body must be left out or equal "
            f"{CAPTURE_FIELD}.{PREFIX_IDS_FIELD}",
            PREFIX_IDS_FIELD,
        )
    return admission


def upstream_request(
    adapter: VLLMCaptureAdapter, body: Mapping[str, Any], admission: Admission
) -> dict[str, Any]:
    """The body sent upstream: no admission, token ids and logprobs asked for, pin entered."""
    prepared = adapter.prepare_request(body)
    if admission.required_prefix_token_ids is not None:
        prepared = adapter.enter_prefix(prepared, admission.required_prefix_token_ids)
    return prepared


def with_coords(raw: bytes, answer: Mapping[str, Any], coords: CommitCoords) -> bytes:
    """The upstream's answer with ``ng_commit_coords`` added.

    ``raw`` is the upstream's body and ``answer`` its parse. The coords are spliced in before
    the closing brace, so the upstream's own bytes (a long logprobs list, its float spelling)
    reach the client as they came and are not serialized a second time.
    """
    coords_json = orjson.dumps(coords.to_json())
    body = raw.rstrip(b" \t\r\n")
    if answer and COORDS_FIELD not in answer and body.endswith(b"}"):
        return body[:-1] + b',"' + COORDS_FIELD.encode() + b'":' + coords_json + b"}"
    return orjson.dumps({**answer, COORDS_FIELD: coords.to_json()})


def fails_closed(coords: CommitCoords) -> bool:
    """Whether the call must not be served: upstream did not honour a pinned prefix."""
    return coords.reason_code == REASON_REQUIRED_PREFIX_MISMATCH


def prefix_mismatch_body(coords: CommitCoords) -> bytes:
    """The 409 body for a pinned prefix the prompt does not start with."""
    error = openai_error(
        f"token capture failed closed: {coords.reason}",
        param=f"{CAPTURE_FIELD}.{PREFIX_IDS_FIELD}",
        code=REASON_REQUIRED_PREFIX_MISMATCH,
    )
    return orjson.dumps({**error, COORDS_FIELD: coords.to_json()})
