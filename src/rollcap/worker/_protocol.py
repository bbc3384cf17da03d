"""What the worker says on the wire, decided without I/O: admissions in, bodies out.

Wire (STAGING §1.4, §1.5, §4.1): the gate sends a chat request with ``stream: false``, the token
fields asked for, and the admission in ``ng_capture``; the engine gets the request without the
admission, with ``required_prefix_token_ids`` set to the parent chain's exact ids for a
continuation (the concatenated ``token_ids_delta`` of its ``staging_chain``, or the admission's
inline prefix); the gate gets the engine's JSON unchanged plus ``ng_commit_coords``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from rollcap._json import json_type_name
from rollcap.dialects import openai_error
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    PREFIX_IDS_FIELD,
    CaptureAdapter,
    CaptureAdmission,
    CommitCoords,
    StagedCallBaseSnapshot,
    compute_chain_hash,
)

__all__ = [
    "ENGINE_FIELDS",
    "Refusal",
    "chain_prefix",
    "engine_request",
    "failed_coords",
    "read_admission",
    "with_coords",
]


class Refusal(Exception):
    """A captured request the worker refuses before anything goes upstream (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> bytes:
        return orjson.dumps(openai_error(str(self), param=self.param))


def _validation_message(exc: ValidationError) -> str:
    """Pydantic's errors on one line, each named by its place in ``ng_capture``."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{CAPTURE_FIELD}{'.' + where if where else ''}: {error['msg']}")
    return "; ".join(parts)


def read_admission(body: Mapping[str, Any]) -> CaptureAdmission:
    """The admission of a request that carries ``ng_capture``; ``Refusal`` naming the field
    when the request cannot be captured as sent.

    Refused: ``stream`` true (a capture stages complete answers only); an ``ng_capture`` that
    is not a valid ``CaptureAdmission``; a ``required_prefix_token_ids`` in the body other than
    absent, null or the admission's inline prefix (the worker pins the prefix it resolves from
    the admission, and a body saying otherwise was not built from it).
    """
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
        admission = CaptureAdmission.model_validate(raw)
    except ValidationError as exc:
        message = f"invalid {CAPTURE_FIELD}: {_validation_message(exc)}"
        raise Refusal(message, CAPTURE_FIELD) from None
    pin = body.get(PREFIX_IDS_FIELD)
    inline = admission.required_prefix_token_ids
    if pin is not None and not (
        isinstance(pin, list) and all(type(item) is int for item in pin) and pin == inline
    ):
        raise Refusal(
            f"{PREFIX_IDS_FIELD} in the body must be absent or the admission's inline prefix "
            f"({len(inline)} ids): the worker pins the prefix it resolves from {CAPTURE_FIELD}",
            PREFIX_IDS_FIELD,
        )
    return admission


def chain_prefix(
    admission: CaptureAdmission, snapshots: Sequence[StagedCallBaseSnapshot]
) -> list[int]:
    """The continuation's exact prefix: the chain's ``token_ids_delta``, root first, concatenated.

    ``snapshots`` are what the source returned for ``admission.staging_chain``. They must be one
    unbroken chain of this rollout, from a root to the admission's parent, whose chain hashes,
    recomputed from the ids, end in the admission's ``parent_chain_hash``: so the ids pinned
    upstream are the ones the parent's coordinates committed to. ``ValueError`` saying where
    they are not.
    """
    chain = admission.staging_chain
    if len(snapshots) != len(chain):
        raise ValueError(f"{len(snapshots)} staged records for {len(chain)} staging_chain keys")
    prefix: list[int] = []
    chain_hash: str | None = None
    parent: StagedCallBaseSnapshot | None = None
    for key, snapshot in zip(chain, snapshots, strict=True):
        if snapshot.rollout_id != admission.rollout_id:
            raise ValueError(f"{key} is a call of rollout {snapshot.rollout_id!r}")
        expected_parent = None if parent is None else parent.model_call_id
        if snapshot.parent_call_id != expected_parent or snapshot.prev_len != len(prefix):
            raise ValueError(
                f"{key} (parent {snapshot.parent_call_id!r}, prev_len {snapshot.prev_len}) does "
                f"not continue the chain before it (parent {expected_parent!r}, {len(prefix)} ids)"
            )
        chain_hash = compute_chain_hash(chain_hash, snapshot.token_ids_delta)
        if chain_hash != snapshot.chain_hash:
            raise ValueError(f"{key}: its chain hash does not follow from its ids")
        prefix += snapshot.token_ids_delta
        parent = snapshot
    assert parent is not None  # a token_in admission with a chain has at least one key
    if parent.model_call_id != admission.parent_call_id:
        raise ValueError(
            f"the chain ends at call {parent.model_call_id!r}, not the parent "
            f"{admission.parent_call_id!r}"
        )
    if chain_hash != admission.parent_chain_hash:
        raise ValueError("the chain's hash is not the admission's parent_chain_hash")
    if len(prefix) != admission.prev_len:
        raise ValueError(f"the chain has {len(prefix)} ids for prev_len {admission.prev_len}")
    return prefix


# What the worker asks of a vLLM engine to read exact ids back: the prompt's ids at the top
# level, and each generated token spelled as its id in the logprobs.
ENGINE_FIELDS: Mapping[str, Any] = {
    "return_token_ids": True,
    "logprobs": True,
    "return_tokens_as_token_ids": True,
}


def engine_request(
    body: Mapping[str, Any], prefix: Sequence[int] | None, adapter: CaptureAdapter
) -> dict[str, Any]:
    """The body sent to the engine, as a new dict: no admission and no ``stream_options``
    (nothing streams), the token fields asked for, and for a continuation the prefix pinned
    through ``adapter.enter_prefix``; without one no pin at all."""
    prepared = {
        key: value for key, value in body.items() if key not in (CAPTURE_FIELD, "stream_options")
    }
    prepared.update(ENGINE_FIELDS)
    prepared.pop(PREFIX_IDS_FIELD, None)
    if prefix is not None:
        adapter.enter_prefix(prepared, prefix)
    return prepared


def failed_coords(admission: CaptureAdmission, weight_version: int) -> CommitCoords:
    """The ``capture_failed`` coordinates of an admitted call that could not even be begun
    (STAGING §4.1's failed shape)."""
    return CommitCoords(
        rollout_id=admission.rollout_id,
        model_call_id=admission.model_call_id,
        parent_call_id=admission.parent_call_id,
        prev_len=admission.prev_len,
        delta_len=0,
        cum_len=admission.prev_len,
        weight_version=weight_version,
        disposition="capture_failed",
    )


def with_coords(raw: bytes, answer: Mapping[str, Any], coords: CommitCoords) -> bytes:
    """The engine's answer with ``ng_commit_coords`` added.

    ``raw`` is the engine's body and ``answer`` its parse. The coords are spliced in before
    the closing brace, so the engine's own bytes (a long logprobs list, its float spelling)
    reach the gate as they came and are not serialized a second time. An answer that already
    has the key (or is empty) is serialized again, the coords replacing what was there.
    """
    coords_json = orjson.dumps(coords.model_dump(mode="json"))
    body = raw.rstrip(b" \t\r\n")
    if answer and COORDS_FIELD not in answer and body.endswith(b"}"):
        return body[:-1] + b',"' + COORDS_FIELD.encode() + b'":' + coords_json + b"}"
    return orjson.dumps({**answer, COORDS_FIELD: coords.model_dump(mode="json")})
