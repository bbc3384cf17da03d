"""The staging wire models: every object that crosses a boundary, as NeMo Gym 0.7.0 shapes it.

Admissions in (``ng_capture``), staged records out, commit coordinates back (``ng_commit_coords``),
the gate's manifest rows and failures, and the trainer's receipt (STAGING §1-§4, §7.1). Every
model refuses unknown keys, NaN and infinities, and takes integers and ids strictly (``true``,
``7.0`` or ``5`` for a string are refused); a JSON integer in a float column becomes a float.
Their JSON form (``model_dump(mode="json")``) has the fields in the order of the wire.

A staged record proves itself: parsing one recomputes its call digest and its extras digest and
refuses a mismatch, so a record that parses is one a trainer may train on.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints, model_validator

from rollcap.staging._digest import (
    EMPTY_EXTRAS_DIGEST,
    compute_extras_digest,
    compute_staging_digest,
)

__all__ = [
    "CAPTURE_FAILED",
    "CAPTURE_FIELD",
    "COORDS_FIELD",
    "REASON_INVALID_WORKER_COMMIT_COORDINATES",
    "REASON_LEDGER_ROW_MISSING_CHAIN_HASH",
    "REASON_LEDGER_ROW_MISSING_RESPONSE_ID",
    "REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
    "REASON_UNRESOLVED_PARENT",
    "REASON_WORKER_CAPTURE_FAILED",
    "REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES",
    "STAGED",
    "CallRecord",
    "CaptureAdmission",
    "CaptureError",
    "CommitCoords",
    "ExtrasCommitment",
    "LinearizedRow",
    "ManifestFailure",
    "RolloutManifest",
    "RolloutReceipt",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "StagedRecordError",
    "StagingError",
    "StreamingUnsupportedError",
    "WeightVersionSpan",
    "check_rollout_id",
    "parse_staged_record",
    "staging_key",
]

CAPTURE_FIELD = "ng_capture"
COORDS_FIELD = "ng_commit_coords"

STAGED: Final = "staged"
CAPTURE_FAILED: Final = "capture_failed"

# The gate's and the manifest builder's reason codes (STAGING §7.4): a wire vocabulary, never
# repurposed.
REASON_UNRESOLVED_PARENT = "unresolved_parent"
REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES = "request_finished_without_staged_coordinates"
REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES = "worker_response_missing_commit_coordinates"
REASON_WORKER_CAPTURE_FAILED = "worker_capture_failed"
REASON_INVALID_WORKER_COMMIT_COORDINATES = "invalid_worker_commit_coordinates"
REASON_LEDGER_ROW_MISSING_RESPONSE_ID = "ledger_row_missing_response_id"
REASON_LEDGER_ROW_MISSING_CHAIN_HASH = "ledger_row_missing_chain_hash"


class StagingError(Exception):
    """Base of the errors this package raises on purpose (besides ``ValueError`` on parse)."""


class CaptureError(StagingError):
    """A caller broke the capture's contract (a bad prefix, a call completed twice, ...)."""


class StreamingUnsupportedError(CaptureError):
    """A captured call asked to stream: the capture stages complete answers only."""


class StagedRecordError(StagingError, ValueError):
    """A stored record cannot be read as a schema-2 staged record; the message says why."""


# The rollout ids the ledger and the token store make file names of (STAGING §4.4).
_STORED_ROLLOUT_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)


def check_rollout_id(rollout_id: object) -> str:
    """``rollout_id`` when it matches ``[A-Za-z0-9._-]+`` (the ledger's and the token store's
    file names); else ``ValueError``.

    The message is ``Invalid rollout id: <repr>`` exactly: the control route serves it as the
    body of its 400 answer (STAGING §8.2).
    """
    if not isinstance(rollout_id, str) or _STORED_ROLLOUT_ID.fullmatch(rollout_id) is None:
        raise ValueError(f"Invalid rollout id: {rollout_id!r}")
    return rollout_id


def staging_key(rollout_id: str, model_call_id: str) -> str:
    """The default staging key, ``<rollout_id>/<model_call_id>``; both must be non-empty."""
    if not rollout_id or not model_call_id:
        raise ValueError("a staging key needs a non-empty rollout id and model call id")
    return f"{rollout_id}/{model_call_id}"


_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

Id = Annotated[str, StringConstraints(min_length=1)]
Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Count = Annotated[int, Field(ge=0)]
TokenId = Annotated[int, Field(ge=0)]
Mode = Literal["text", "token_in"]


def _rule(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _lineage(parent_call_id: str | None, mode: str, prev_len: int) -> None:
    """A root is ``text`` at 0; a child is ``token_in`` past 0."""
    if parent_call_id is None:
        _rule(mode == "text" and prev_len == 0, "a call without a parent must be mode text at 0")
    else:
        _rule(mode == "token_in" and prev_len > 0, "a call with a parent must be token_in past 0")


class CaptureAdmission(BaseModel):
    """What the gate tells the worker about one training call (``ng_capture``, STAGING §1.1)."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    rollout_id: Id
    model_call_id: Id
    parent_call_id: Id | None = None
    prev_len: Count = 0
    mode: Mode
    required_prefix_token_ids: list[TokenId] = Field(default_factory=list)
    staging_chain: list[str] = Field(default_factory=list)
    parent_chain_hash: Hex64 | None = None

    @model_validator(mode="after")
    def _shape(self) -> CaptureAdmission:
        if self.mode == "token_in":
            _rule(self.parent_call_id is not None, "a token_in admission needs a parent_call_id")
            _rule(self.prev_len > 0, "a token_in admission needs prev_len > 0")
            _rule(self.parent_chain_hash is not None, "a token_in admission needs a chain hash")
            if not self.staging_chain:
                _rule(
                    len(self.required_prefix_token_ids) == self.prev_len,
                    "without a staging_chain the inline prefix must have prev_len ids",
                )
        else:
            _rule(
                self.parent_call_id is None
                and self.prev_len == 0
                and not self.required_prefix_token_ids
                and not self.staging_chain
                and self.parent_chain_hash is None,
                "a text admission has no parent, prefix, chain or chain hash",
            )
        return self


class StagedCallBaseSnapshot(BaseModel):
    """A staged record without its extras (fields 1-18): what a source returns for a key.

    Parsing recomputes the call digest and refuses a mismatch; it does not prove the extras.
    """

    model_config = _STRICT

    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1
    rollout_id: Id
    model_call_id: Id
    parent_call_id: Id | None = None
    mode: Mode
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    digest: Hex64
    token_ids_delta: list[TokenId]
    token_mask_delta: list[float]
    generation_log_probs_delta: list[float]
    extras_digest: Hex64 = EMPTY_EXTRAS_DIGEST
    chain_hash: Hex64
    cumulative_hash: Hex64

    @model_validator(mode="after")
    def _digested(self) -> StagedCallBaseSnapshot:
        _lineage(self.parent_call_id, self.mode, self.prev_len)
        expected = compute_staging_digest(**self._digest_fields())
        _rule(expected == self.digest, f"call {self.model_call_id}: staged digest mismatch")
        return self

    def _digest_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _DIGESTED_FIELDS}

    @property
    def staging_key(self) -> str:
        """The default key of this record (a sink may use another)."""
        return staging_key(self.rollout_id, self.model_call_id)


_DIGESTED_FIELDS = tuple(
    name for name in StagedCallBaseSnapshot.model_fields if name not in ("digest",)
)


class StagedCallRecord(StagedCallBaseSnapshot):
    """One staged call (schema 2, STAGING §2): the token delta over its parent, digested."""

    extras: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _extras_digested(self) -> StagedCallRecord:
        _rule(
            compute_extras_digest(self.extras) == self.extras_digest,
            f"call {self.model_call_id}: extras digest mismatch",
        )
        return self

    def base(self) -> StagedCallBaseSnapshot:
        """This record without its extras."""
        data = self.model_dump()
        data.pop("extras")
        return StagedCallBaseSnapshot.model_construct(**data)


class StagedCallSnapshot(StagedCallRecord):
    """A full staged record as a source returns it."""


def parse_staged_record(data: bytes | str) -> StagedCallRecord:
    """A stored record's JSON as a ``StagedCallRecord``; ``StagedRecordError`` saying why not.

    A schema-1 record (rollcap's unreleased earlier format) is named as such: it cannot be
    read as schema 2 and must be staged again.
    """
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StagedRecordError(f"a staged record is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise StagedRecordError("a staged record must be a JSON object")
    version = raw.get("schema_version")
    if version == 1 and type(version) is int:
        raise StagedRecordError(
            "a schema_version 1 staged record (rollcap's earlier, unreleased staging format): "
            "only schema 2 (NeMo Gym 0.7.0's) is read; stage the rollout again"
        )
    try:
        return StagedCallRecord.model_validate(raw)
    except ValueError as exc:
        raise StagedRecordError(f"not a valid schema-2 staged record: {exc}") from None


class StageResult(BaseModel):
    """What a sink answers for one ``stage`` (STAGING §5.1)."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    ok: bool
    staging_key: Id | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> StageResult:
        if self.ok:
            _rule(self.staging_key is not None, "a successful stage needs a staging_key")
        else:
            _rule(bool(self.error), "a failed stage needs a non-empty error")
        return self


class CommitCoords(BaseModel):
    """What the worker answers for an admitted call (``ng_commit_coords``, STAGING §4.1)."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1
    rollout_id: Id
    model_call_id: Id
    parent_call_id: Id | None = None
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    disposition: Literal["staged", "capture_failed"] = "staged"
    digest: Hex64 | None = None
    extras_digest: Hex64 | None = None
    staging_key: Id | None = None
    chain_hash: Hex64 | None = None
    cumulative_hash: Hex64 | None = None

    @model_validator(mode="after")
    def _shape(self) -> CommitCoords:
        _rule(
            (self.parent_call_id is None) == (self.prev_len == 0),
            "commit coordinates have a parent exactly when prev_len > 0",
        )
        _rule(self.cum_len == self.prev_len + self.delta_len, "cum_len must be prev + delta")
        custody = (
            self.digest,
            self.extras_digest,
            self.staging_key,
            self.chain_hash,
            self.cumulative_hash,
        )
        if self.disposition == STAGED:
            _rule(self.delta_len > 0, "staged coordinates need delta_len > 0")
            _rule(None not in custody, "staged coordinates need all five custody fields")
        else:
            _rule(self.delta_len == 0, "capture_failed coordinates have delta_len 0")
            _rule(all(v is None for v in custody), "capture_failed coordinates carry no custody")
        return self

    @property
    def staged(self) -> bool:
        return self.disposition == STAGED


class CallRecord(BaseModel):
    """One committed call of a rollout as the gate's manifest lists it (STAGING §4.3)."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1
    model_call_id: Id
    parent_call_id: Id | None = None
    prev_len: Count
    delta_len: Count
    cum_len: Count
    weight_version: Count
    digest: Hex64
    extras_digest: Hex64
    staging_key: Id
    mode: Mode = "token_in"
    chain_hash: Hex64
    cumulative_hash: Hex64
    response_id: Id
    admitted_at: float | None = None
    output_fingerprint: Hex64 | None = None
    continuation_fingerprint: Hex64 | None = None
    fingerprint_version: Count = 0

    @model_validator(mode="after")
    def _shape(self) -> CallRecord:
        _rule(self.delta_len > 0, "a call record needs delta_len > 0")
        _rule(self.cum_len == self.prev_len + self.delta_len, "cum_len must be prev + delta")
        _lineage(self.parent_call_id, self.mode, self.prev_len)
        return self


class ManifestFailure(BaseModel):
    """One failure row of a rollout's manifest: a call that must not be trained on."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    model_call_id: Id
    reason: Id


class RolloutManifest(BaseModel):
    """A rollout's ledger as the control route serves it: committed calls and failures."""

    model_config = _STRICT

    schema_version: Literal[2] = 2
    rollout_id: Id
    records: list[CallRecord] = Field(default_factory=list)
    failures: list[ManifestFailure] = Field(default_factory=list)


TerminalSelectionMethod = Literal["declared", "response_id", "content", "heuristic"]


class RolloutReceipt(BaseModel):
    """What a trainer asserts about one finished rollout before rebuilding it (STAGING §7.1).

    Three states only: trainable (not poisoned, no failure, terminal and selection set);
    poisoned after attribution; poisoned with a ``failure_reason`` before any attribution.
    """

    model_config = _STRICT

    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1
    rollout_id: Id
    reward: float | None = None
    terminal_model_call_id: Id | None = None
    manifest: list[CallRecord] = Field(default_factory=list)
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: TerminalSelectionMethod | None = None
    terminal_attribution_reason: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> RolloutReceipt:
        ids = [row.model_call_id for row in self.manifest]
        _rule(len(set(ids)) == len(ids), "the manifest's model call ids must be unique")
        if self.terminal_model_call_id is not None:
            _rule(self.terminal_model_call_id in ids, "the terminal call must be in the manifest")
        if self.terminal_model_call_id is not None:
            _rule(self.terminal_selection is not None, "a receipt's terminal names its selection")
        if self.failure_reason is not None:
            _rule(self.capture_poisoned, "a receipt with a failure_reason is poisoned")
        if not self.capture_poisoned:
            _rule(
                self.terminal_model_call_id is not None,
                "a trainable receipt names its terminal call and how it was selected",
            )
        elif self.terminal_selection is None:
            _rule(
                self.failure_reason is not None,
                "a poisoned receipt without attribution carries its failure_reason",
            )
        return self


class WeightVersionSpan(BaseModel):
    """One call's ``[start, end)`` in a linearized row, with the weights that produced it."""

    model_config = _STRICT

    model_call_id: str
    start: int
    end: int
    weight_version: int


class ExtrasCommitment(BaseModel):
    """What one call's extras must hash to: checked by a consumer where it fetches them."""

    model_config = _STRICT

    model_call_id: str
    extras_digest_version: int
    extras_digest: str


class LinearizedRow(BaseModel):
    """A rollout's terminal chain as one training row (STAGING §7.2)."""

    model_config = _STRICT

    rollout_id: str
    token_ids: list[int]
    token_mask: list[float]
    logprobs: list[float]
    model_call_ids: list[str]
    prompt_len: int
    weight_versions: list[int]
    weight_version_spans: list[WeightVersionSpan]
    # Lax here only: JSON has no tuples, so a row read back gives lists.
    link_spans: list[Annotated[tuple[str, int, int], Strict(False)]]
    extras_commitments: list[ExtrasCommitment]

    @property
    def call_ids(self) -> list[str]:
        """The chain's call ids, root first (the same list as ``model_call_ids``)."""
        return self.model_call_ids
