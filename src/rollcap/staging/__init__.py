"""Token-id staging for RL: exact token ids, masks and logprobs per model call.

Training must use the token ids the model actually saw and produced, never a re-tokenization
of text. Inside an inference worker, ``RolloutTokenCapture`` turns each served call into a
``StagedCallRecord`` (the call's token delta over its parent, digested and chained), makes it
durable through a ``StagingSink`` before the response goes out, and returns ``CommitCoords``
that are small enough to ride in the response body. ``linearize`` reads a rollout back and
rebuilds each call chain's full sequence, verifying every digest on the way.

This package is a leaf: it imports only the standard library, orjson and ``rollcap.ids``, so a
training framework can use it without the model server's stack. The digest scheme is specified
in ``docs/staging-digest.md``.
"""

from rollcap.staging._adapters import (
    PREFIX_IDS_FIELD,
    REQUEST_FIELDS,
    CaptureAdapter,
    VLLMCaptureAdapter,
)
from rollcap.staging._capture import PendingCall, RolloutTokenCapture
from rollcap.staging._digest import EMPTY_EXTRAS_DIGEST, ROOT_CHAIN_HASH
from rollcap.staging._linearize import (
    LinearizedChain,
    linearize,
    linearize_records,
    verify_record,
)
from rollcap.staging._records import (
    CAPTURE_FAILED,
    CAPTURE_FIELD,
    COORDS_FIELD,
    REASON_CALL_FAILED,
    REASON_DUPLICATE_CALL,
    REASON_EXTRACTION_FAILED,
    REASON_INTERNAL_ERROR,
    REASON_INVALID_ADMISSION,
    REASON_INVALID_INPUT,
    REASON_NOT_IN_FLIGHT,
    REASON_PARENT_PREFIX_MISMATCH,
    REASON_REQUIRED_PREFIX_MISMATCH,
    REASON_SINK_FAILED,
    REASON_UNKNOWN_PARENT,
    SCHEMA_VERSION,
    STAGED,
    Admission,
    CommitCoords,
    ExtractionError,
    LinearizeError,
    StagedCallRecord,
    StagedRecordError,
    StagingError,
    validate_model_call_id,
)
from rollcap.staging._sinks import (
    DirectoryStagingSink,
    InMemoryStagingSink,
    StagingSink,
    StagingSource,
)

__all__ = [
    "CAPTURE_FAILED",
    "CAPTURE_FIELD",
    "COORDS_FIELD",
    "EMPTY_EXTRAS_DIGEST",
    "PREFIX_IDS_FIELD",
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
    "REQUEST_FIELDS",
    "ROOT_CHAIN_HASH",
    "SCHEMA_VERSION",
    "STAGED",
    "Admission",
    "CaptureAdapter",
    "CommitCoords",
    "DirectoryStagingSink",
    "ExtractionError",
    "InMemoryStagingSink",
    "LinearizeError",
    "LinearizedChain",
    "PendingCall",
    "RolloutTokenCapture",
    "StagedCallRecord",
    "StagedRecordError",
    "StagingError",
    "StagingSink",
    "StagingSource",
    "VLLMCaptureAdapter",
    "linearize",
    "linearize_records",
    "validate_model_call_id",
    "verify_record",
]
