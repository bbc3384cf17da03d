"""The records that cross boundaries: admissions in, staged call records out, commit coords back.

Error tree (everything this package raises on purpose)::

    StagingError
    ├── ExtractionError      an adapter cannot find exact token ids in an engine response
    ├── StagedRecordError    a stored record cannot be read back (bad JSON, shape or schema)
    └── LinearizeError       a rollout's records do not verify or do not form chains

Constructors and ``from_json`` validate shapes and refuse (``ValueError`` naming the field) rather
than coerce: a record that is accepted is one that can be digested and written back unchanged.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollcap.ids import validate_rollout_id
from rollcap.staging import _digest

__all__ = [
    "CAPTURE_FAILED",
    "CAPTURE_FIELD",
    "COORDS_FIELD",
    "MODEL_CALL_ID_PATTERN",
    "REASON_CALL_FAILED",
    "REASON_DUPLICATE_CALL",
    "REASON_EXTRACTION_FAILED",
    "REASON_INTERNAL_ERROR",
    "REASON_INVALID_ADMISSION",
    "REASON_INVALID_INPUT",
    "REASON_NOT_IN_FLIGHT",
    "REASON_PARENT_PREFIX_MISMATCH",
    "REASON_REQUIRED_PREFIX_MISMATCH",
    "REASON_SINK_FAILED",
    "REASON_UNKNOWN_PARENT",
    "SCHEMA_VERSION",
    "STAGED",
    "Admission",
    "CommitCoords",
    "ExtractionError",
    "LinearizeError",
    "StagedCallRecord",
    "StagedRecordError",
    "StagingError",
    "check_float32_values",
    "check_token_ids",
    "staging_key",
    "validate_model_call_id",
]

SCHEMA_VERSION = 1

STAGED = "staged"
CAPTURE_FAILED = "capture_failed"
_DISPOSITIONS = (STAGED, CAPTURE_FAILED)

# The request field that carries an admission, and the response field that carries the coords.
CAPTURE_FIELD = "ng_capture"
COORDS_FIELD = "ng_commit_coords"

# A failed capture's reason is "<code>: <detail>"; the code is stable, the detail is for people.
REASON_INVALID_ADMISSION = "invalid_admission"
REASON_DUPLICATE_CALL = "duplicate_call"
REASON_UNKNOWN_PARENT = "unknown_parent"
REASON_REQUIRED_PREFIX_MISMATCH = "required_prefix_mismatch"
REASON_PARENT_PREFIX_MISMATCH = "parent_prefix_mismatch"
REASON_INVALID_INPUT = "invalid_input"
REASON_EXTRACTION_FAILED = "extraction_failed"
REASON_SINK_FAILED = "sink_failed"
REASON_CALL_FAILED = "call_failed"
REASON_NOT_IN_FLIGHT = "not_in_flight"
REASON_INTERNAL_ERROR = "internal_error"

# Model call ids become directory names, so they get a grammar with no separators or dots.
MODEL_CALL_ID_PATTERN = re.compile(r"[0-9a-f]{1,64}\Z", re.ASCII)
_MODEL_CALL_ID_RULE = "^[0-9a-f]{1,64}$"
_U64_MAX = 2**64 - 1


class StagingError(Exception):
    """Base of every error this package raises on purpose."""


class ExtractionError(StagingError):
    """An engine response does not carry the exact token ids and logprobs capture needs."""


class _CallError(StagingError):
    def __init__(self, message: str, *, model_call_id: str | None, staging_key: str | None):
        super().__init__(message)
        self.model_call_id = model_call_id
        self.staging_key = staging_key


class StagedRecordError(_CallError):
    """A stored record cannot be read back; ``model_call_id`` and ``staging_key`` name it."""


class LinearizeError(_CallError):
    """A rollout's staged records fail verification; the message names the call.

    ``model_call_id`` and ``staging_key`` are those of the first call found at fault (``None``
    only when the fault belongs to no single call, such as an unreadable rollout directory).
    """


def staging_key(rollout_id: str, model_call_id: str) -> str:
    return f"{rollout_id}/{model_call_id}"


def validate_model_call_id(value: object, field_name: str = "model_call_id") -> str:
    """Return ``value`` when it is 1 to 64 lowercase hex digits, else raise ``ValueError``."""
    if not isinstance(value, str) or MODEL_CALL_ID_PATTERN.match(value) is None:
        shown = value if not isinstance(value, str) or len(value) <= 70 else value[:67] + "..."
        raise ValueError(f"invalid {field_name} {shown!r}: must match {_MODEL_CALL_ID_RULE}")
    return value


def _rollout_id(value: object, field_name: str = "rollout_id") -> str:
    try:
        return validate_rollout_id(value)
    except ValueError as exc:
        raise ValueError(f"{field_name}: {exc}") from None


def check_token_ids(value: object, field_name: str) -> tuple[int, ...]:
    """A sequence of plain ints in the uint64 range, as a tuple; ``ValueError`` otherwise.

    The type test runs over ``set(map(type, ...))`` and the range test inside ``array``, both in
    C: prompts run to tens of thousands of ids and this sits on the serving path.
    """
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise ValueError(f"{field_name} must be a list of integers, not {type(value).__name__}")
    kinds = set(map(type, value))
    if kinds - {int}:
        odd = sorted(k.__name__ for k in kinds - {int})
        raise ValueError(f"{field_name} must hold only integers, found {', '.join(odd)}")
    try:
        array("Q", value)
    except OverflowError:
        raise ValueError(f"{field_name} holds an id outside 0..2**64-1") from None
    return tuple(value)


def check_float32_values(value: object, field_name: str) -> tuple[float, ...]:
    """Finite numbers that are exactly representable in binary32, as a tuple of floats."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise ValueError(f"{field_name} must be a list of numbers, not {type(value).__name__}")
    kinds = set(map(type, value))
    if kinds - {int, float}:
        odd = sorted(k.__name__ for k in kinds - {int, float})
        raise ValueError(f"{field_name} must hold only numbers, found {', '.join(odd)}")
    floats = tuple(map(float, value))
    if not all(map(math.isfinite, floats)):
        raise ValueError(f"{field_name} holds NaN or an infinity")
    # A value that binary32 cannot hold would hash like its rounded neighbour: a digest that
    # does not see a change would not be a digest.
    if array("f", floats).tolist() != list(floats):
        raise ValueError(f"{field_name} holds a value that is not exactly a binary32 float")
    return floats


def _check_mask(value: object, field_name: str) -> tuple[int, ...]:
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise ValueError(f"{field_name} must be a list of 0 and 1, not {type(value).__name__}")
    if set(map(type, value)) - {int} or set(value) - {0, 1}:
        raise ValueError(f"{field_name} must hold only the integers 0 and 1")
    return tuple(value)


def _check_count(value: object, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise ValueError(f"{field_name} must be an integer in 0..2**64-1, not {value!r}")
    return value


def _check_digest(value: object, field_name: str) -> str:
    if not _digest.is_digest_hex(value):
        raise ValueError(f"{field_name} must be 64 lowercase hex digits, not {value!r}")
    assert isinstance(value, str)
    return value


def _plain_json(value: object, path: str) -> object:
    """A deep copy with tuples as lists, so a record compares equal after a JSON round trip and
    the caller's later mutations cannot change what was digested."""
    if isinstance(value, Mapping):
        return {str(k): _plain_json(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _normalize_extras(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"extras must be a map or null, not {type(value).__name__}")
    # Encoding first refuses what cannot be digested (NaN, non-string keys, odd types).
    _digest.encode_extras(value)
    plain = _plain_json(value, "extras")
    assert isinstance(plain, dict)
    return plain


def _require_mapping(obj: object, what: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise ValueError(f"{what} must be a JSON object, not {type(obj).__name__}")
    return obj


@dataclass(frozen=True, slots=True)
class Admission:
    """Who a model call is and what token prefix its prompt must start with.

    ``required_prefix_token_ids`` pins the prompt's first ids exactly; without it a child call's
    prompt must start with its parent's full ids. Ids are validated on construction, so an
    ``Admission`` that exists is one whose staging key is a safe path.
    """

    rollout_id: str
    model_call_id: str
    parent_model_call_id: str | None = None
    required_prefix_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _rollout_id(self.rollout_id)
        validate_model_call_id(self.model_call_id)
        if self.parent_model_call_id is not None:
            validate_model_call_id(self.parent_model_call_id, "parent_model_call_id")
            if self.parent_model_call_id == self.model_call_id:
                raise ValueError("parent_model_call_id must differ from model_call_id")
        if self.required_prefix_token_ids is not None:
            ids = check_token_ids(self.required_prefix_token_ids, "required_prefix_token_ids")
            object.__setattr__(self, "required_prefix_token_ids", ids)

    @property
    def staging_key(self) -> str:
        return staging_key(self.rollout_id, self.model_call_id)

    @classmethod
    def from_json(cls, obj: object) -> Admission:
        """Parse the ``ng_capture`` object; ``ValueError`` naming the field when malformed."""
        body = _require_mapping(obj, CAPTURE_FIELD)
        for key in ("rollout_id", "model_call_id"):
            if key not in body:
                raise ValueError(f"{CAPTURE_FIELD}.{key} is missing")
        prefix = body.get("required_prefix_token_ids")
        if prefix is not None and not isinstance(prefix, list | tuple):
            raise ValueError(
                f"required_prefix_token_ids must be a list of integers or null, "
                f"not {type(prefix).__name__}",
            )
        return cls(
            rollout_id=body["rollout_id"],
            model_call_id=body["model_call_id"],
            parent_model_call_id=body.get("parent_model_call_id"),
            required_prefix_token_ids=None if prefix is None else tuple(prefix),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "model_call_id": self.model_call_id,
            "parent_model_call_id": self.parent_model_call_id,
            "required_prefix_token_ids": (
                None
                if self.required_prefix_token_ids is None
                else list(self.required_prefix_token_ids)
            ),
        }


@dataclass(frozen=True, slots=True)
class CommitCoords:
    """What a worker reports back for one call: where it was staged, or why it was not.

    Token-free and small, so it can ride in the response body. ``staged`` coords carry the
    cumulative length and the digests a reader can check the staged record against; for
    ``capture_failed`` those are ``None`` and ``reason`` says why (``"<code>: <detail>"``).
    """

    disposition: str
    staging_key: str
    rollout_id: str
    model_call_id: str
    cum_len: int | None = None
    digest: str | None = None
    extras_digest: str | None = None
    chain_hash: str | None = None
    parent_chain_hash: str | None = None
    reason: str | None = None
    prev_len: int | None = None

    def __post_init__(self) -> None:
        if self.disposition not in _DISPOSITIONS:
            raise ValueError(
                f"disposition must be one of {_DISPOSITIONS}, not {self.disposition!r}"
            )
        for name in ("staging_key", "rollout_id", "model_call_id"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        if self.disposition == STAGED:
            _rollout_id(self.rollout_id)
            validate_model_call_id(self.model_call_id)
            if self.staging_key != staging_key(self.rollout_id, self.model_call_id):
                raise ValueError(f"staging_key {self.staging_key!r} does not match the ids")
            _check_count(self.cum_len, "cum_len")
            _check_count(self.prev_len, "prev_len")
            for name in ("digest", "extras_digest", "chain_hash", "parent_chain_hash"):
                _check_digest(getattr(self, name), name)
            if self.reason is not None:
                raise ValueError("reason must be null for staged coords")
        else:
            if not isinstance(self.reason, str) or not self.reason:
                raise ValueError("reason must be a non-empty string for capture_failed coords")
            for name in ("cum_len", "prev_len"):
                if getattr(self, name) is not None:
                    _check_count(getattr(self, name), name)
            for name in ("digest", "extras_digest", "chain_hash", "parent_chain_hash"):
                if getattr(self, name) is not None:
                    _check_digest(getattr(self, name), name)

    @property
    def staged(self) -> bool:
        return self.disposition == STAGED

    @property
    def reason_code(self) -> str | None:
        """The stable part of ``reason`` (before the first ``": "``), or ``None`` when staged."""
        if self.reason is None:
            return None
        return self.reason.split(": ", 1)[0]

    @classmethod
    def failed(
        cls,
        code: str,
        detail: str,
        *,
        rollout_id: str = "",
        model_call_id: str = "",
    ) -> CommitCoords:
        key = staging_key(rollout_id, model_call_id) if rollout_id or model_call_id else ""
        return cls(
            disposition=CAPTURE_FAILED,
            staging_key=key,
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            reason=f"{code}: {detail}",
        )

    @classmethod
    def from_json(cls, obj: object) -> CommitCoords:
        body = _require_mapping(obj, COORDS_FIELD)
        for key in ("disposition", "staging_key", "rollout_id", "model_call_id"):
            if key not in body:
                raise ValueError(f"{COORDS_FIELD}.{key} is missing")
        return cls(
            disposition=body["disposition"],
            staging_key=body["staging_key"],
            rollout_id=body["rollout_id"],
            model_call_id=body["model_call_id"],
            cum_len=body.get("cum_len"),
            digest=body.get("digest"),
            extras_digest=body.get("extras_digest"),
            chain_hash=body.get("chain_hash"),
            parent_chain_hash=body.get("parent_chain_hash"),
            reason=body.get("reason"),
            prev_len=body.get("prev_len"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "disposition": self.disposition,
            "staging_key": self.staging_key,
            "rollout_id": self.rollout_id,
            "model_call_id": self.model_call_id,
            "prev_len": self.prev_len,
            "cum_len": self.cum_len,
            "digest": self.digest,
            "extras_digest": self.extras_digest,
            "chain_hash": self.chain_hash,
            "parent_chain_hash": self.parent_chain_hash,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class StagedCallRecord:
    """One model call's token delta, as staged: what training reads back.

    The delta is the prompt ids after the first ``prev_len`` (inherited from the parent call;
    loss mask 0, logprob 0.0) followed by the generated ids (loss mask 1, their logprobs), so a
    call's full ids are ``parent_full[:prev_len] + token_ids``. Construction checks shapes only;
    ``create`` computes the digests, and ``linearize`` verifies them on the way back.
    """

    rollout_id: str
    model_call_id: str
    parent_model_call_id: str | None
    prev_len: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_version: int
    extras: dict[str, Any]
    digest: str
    extras_digest: str
    parent_chain_hash: str
    chain_hash: str
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION or isinstance(self.schema_version, bool):
            raise ValueError(
                f"unsupported schema_version {self.schema_version!r} "
                f"(this version of rollcap reads {SCHEMA_VERSION})",
            )
        _rollout_id(self.rollout_id)
        validate_model_call_id(self.model_call_id)
        if self.parent_model_call_id is not None:
            validate_model_call_id(self.parent_model_call_id, "parent_model_call_id")
        _check_count(self.prev_len, "prev_len")
        _check_count(self.weight_version, "weight_version")
        set_ = object.__setattr__
        set_(self, "token_ids", check_token_ids(self.token_ids, "token_ids"))
        set_(self, "loss_mask", _check_mask(self.loss_mask, "loss_mask"))
        set_(self, "logprobs", check_float32_values(self.logprobs, "logprobs"))
        if not len(self.token_ids) == len(self.loss_mask) == len(self.logprobs):
            raise ValueError(
                f"token_ids, loss_mask and logprobs differ in length "
                f"({len(self.token_ids)}, {len(self.loss_mask)}, {len(self.logprobs)})",
            )
        if self.prev_len + len(self.token_ids) > _U64_MAX:
            raise ValueError("prev_len + len(token_ids) exceeds 2**64-1")
        set_(self, "extras", _normalize_extras(self.extras))
        for name in ("digest", "extras_digest", "parent_chain_hash", "chain_hash"):
            _check_digest(getattr(self, name), name)

    @property
    def staging_key(self) -> str:
        return staging_key(self.rollout_id, self.model_call_id)

    @property
    def cum_len(self) -> int:
        """The length of this call's full ids (inherited prefix plus delta)."""
        return self.prev_len + len(self.token_ids)

    @classmethod
    def create(
        cls,
        *,
        rollout_id: str,
        model_call_id: str,
        parent_model_call_id: str | None,
        parent_chain_hash: str,
        prev_len: int,
        token_ids: Sequence[int],
        loss_mask: Sequence[int],
        logprobs: Sequence[float],
        weight_version: int,
        extras: Mapping[str, Any] | None = None,
    ) -> StagedCallRecord:
        """Build a record and compute its digest, extras digest and chain hash."""
        normalized = _normalize_extras(extras)
        digest = _digest.call_digest(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            parent_model_call_id=parent_model_call_id,
            prev_len=prev_len,
            weight_version=weight_version,
            token_ids=token_ids,
            loss_mask=loss_mask,
            logprobs=logprobs,
        )
        extras_digest = _digest.extras_digest(normalized)
        return cls(
            rollout_id=rollout_id,
            model_call_id=model_call_id,
            parent_model_call_id=parent_model_call_id,
            prev_len=prev_len,
            token_ids=tuple(token_ids),
            loss_mask=tuple(loss_mask),
            logprobs=tuple(logprobs),
            weight_version=weight_version,
            extras=normalized,
            digest=digest,
            extras_digest=extras_digest,
            parent_chain_hash=parent_chain_hash,
            chain_hash=_digest.chain_hash(
                parent_chain_hash=parent_chain_hash,
                prev_len=prev_len,
                digest=digest,
                extras_digest=extras_digest,
            ),
        )

    def coords(self) -> CommitCoords:
        """The ``staged`` coords that point at this record."""
        return CommitCoords(
            disposition=STAGED,
            staging_key=self.staging_key,
            rollout_id=self.rollout_id,
            model_call_id=self.model_call_id,
            prev_len=self.prev_len,
            cum_len=self.cum_len,
            digest=self.digest,
            extras_digest=self.extras_digest,
            chain_hash=self.chain_hash,
            parent_chain_hash=self.parent_chain_hash,
        )

    def to_json(self) -> dict[str, Any]:
        """The schema-1 JSON object; ``staging_key`` and ``cum_len`` are derived, for readers."""
        return {
            "schema_version": self.schema_version,
            "rollout_id": self.rollout_id,
            "model_call_id": self.model_call_id,
            "staging_key": self.staging_key,
            "parent_model_call_id": self.parent_model_call_id,
            "prev_len": self.prev_len,
            "cum_len": self.cum_len,
            "weight_version": self.weight_version,
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "extras": self.extras,
            "digest": self.digest,
            "extras_digest": self.extras_digest,
            "parent_chain_hash": self.parent_chain_hash,
            "chain_hash": self.chain_hash,
        }

    @classmethod
    def from_json(cls, obj: object) -> StagedCallRecord:
        """Parse a schema-1 object; ``ValueError`` naming the field when malformed.

        The derived fields must agree with the ids and lengths they derive from; digests are
        not recomputed here (``linearize`` does that, and says which one failed).
        """
        body = _require_mapping(obj, "staged record")
        version = body.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise ValueError(
                f"unsupported schema_version {version!r} "
                f"(this version of rollcap reads {SCHEMA_VERSION})",
            )
        required = (
            "rollout_id",
            "model_call_id",
            "parent_model_call_id",
            "prev_len",
            "weight_version",
            "token_ids",
            "loss_mask",
            "logprobs",
            "extras",
            "digest",
            "extras_digest",
            "parent_chain_hash",
            "chain_hash",
        )
        for key in required:
            if key not in body:
                raise ValueError(f"staged record field {key} is missing")
        if body["extras"] is None or not isinstance(body["extras"], Mapping):
            raise ValueError("extras must be a JSON object")
        record = cls(
            rollout_id=body["rollout_id"],
            model_call_id=body["model_call_id"],
            parent_model_call_id=body["parent_model_call_id"],
            prev_len=body["prev_len"],
            token_ids=body["token_ids"],
            loss_mask=body["loss_mask"],
            logprobs=body["logprobs"],
            weight_version=body["weight_version"],
            extras=dict(body["extras"]),
            digest=body["digest"],
            extras_digest=body["extras_digest"],
            parent_chain_hash=body["parent_chain_hash"],
            chain_hash=body["chain_hash"],
            schema_version=version,
        )
        if "staging_key" in body and body["staging_key"] != record.staging_key:
            raise ValueError(f"staging_key {body['staging_key']!r} does not match the ids")
        if "cum_len" in body and body["cum_len"] != record.cum_len:
            raise ValueError(f"cum_len {body['cum_len']!r} is not prev_len + len(token_ids)")
        return record
