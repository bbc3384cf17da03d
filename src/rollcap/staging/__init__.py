"""RL token staging on NeMo Gym 0.7.0's wire: exact training token ids, masks and logprobs.

Training must use the token ids the model actually saw and produced, never a re-tokenization of
text. The parties (STAGING in the project's specification):

- the **gate** (rollcap's model server with ``token_id_capture.external_staging``) admits each
  training call (``CaptureAdmission`` in ``ng_capture``), resolving its parent from its ledger
  (``FileLineageStore``; fingerprints of the request items), checks the worker's
  ``CommitCoords`` and writes token-free ``CallRecord`` rows and failures, served as a
  ``RolloutManifest`` on a bearer-protected control route;
- the **worker**, in front of the engine, hosts ``RolloutTokenCapture``: each call becomes a
  ``StagedCallRecord`` (the ids new since its parent, digested and chained), durable through a
  ``StagingSink`` before the answer goes out; ``VLLMCaptureAdapter`` and
  ``MegatronCaptureAdapter`` read the engine's answers;
- the **trainer** reads the manifest (``RolloutControlClient``), builds a ``RolloutReceipt``
  (``attribute_and_receive``: poisoned when any call failed), fetches base snapshots from a
  ``StagingSource`` and runs ``verify_and_linearize``, which refuses with a coded
  ``ReceiptVerificationError`` anything that does not verify.

The complete-record path (``TokenSink``/``TokenSource``, ``TokenCaptureStore``) and its
conformance suite (``run_conformance``) are here too. The digests reproduce NeMo Gym's golden
vectors (``tests/staging/test_digest.py``).
"""

from rollcap.staging._adapters import (
    PREFIX_IDS_FIELD,
    CaptureAdapter,
    MegatronCaptureAdapter,
    VLLMCaptureAdapter,
    prepare_engine_request,
    strip_capture_transport_fields,
)
from rollcap.staging._capture import (
    ActiveCall,
    CaptureHost,
    RolloutTokenCapture,
    WeightVersionProvider,
    install_capture,
)
from rollcap.staging._conformance import CONFORMANCE_CHECKS, ConformanceError, run_conformance
from rollcap.staging._control import (
    DEFAULT_CONTROL_TOKEN_ENV,
    MANIFEST_PATH_TEMPLATE,
    RolloutControlClient,
    bearer_matches,
)
from rollcap.staging._digest import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    encode_token_ids,
    hash_token_ids,
)
from rollcap.staging._fingerprint import (
    FINGERPRINT_VERSION,
    UnfingerprintableError,
    assistant_fingerprint,
    conversation_digest,
    request_items,
    response_items,
)
from rollcap.staging._ledger import (
    LINEAGE_MARKER_SUFFIX,
    LINEAGE_SUFFIX,
    CaptureLedgerCommit,
    FileLineageStore,
    ParentRow,
    failure_row,
    ledger_row,
    output_fingerprints,
)
from rollcap.staging._rebuild import (
    RebuildError,
    ReceiptVerificationError,
    linearize,
    receipt_for,
    verify_and_linearize,
)
from rollcap.staging._records import (
    CAPTURE_FAILED,
    CAPTURE_FIELD,
    COORDS_FIELD,
    REASON_INVALID_WORKER_COMMIT_COORDINATES,
    REASON_LEDGER_ROW_MISSING_CHAIN_HASH,
    REASON_LEDGER_ROW_MISSING_RESPONSE_ID,
    REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    REASON_UNRESOLVED_PARENT,
    REASON_WORKER_CAPTURE_FAILED,
    REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES,
    STAGED,
    CallRecord,
    CaptureAdmission,
    CaptureError,
    CommitCoords,
    ExtrasCommitment,
    LinearizedRow,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCallSnapshot,
    StagedRecordError,
    StageResult,
    StagingError,
    StreamingUnsupportedError,
    WeightVersionSpan,
    parse_staged_record,
    staging_key,
)
from rollcap.staging._routes import (
    MISSING_ROUTE_SENTINEL,
    classify_route_span,
    decode_routed_experts,
    encode_routed_experts,
)
from rollcap.staging._sinks import (
    DirectoryStagingSink,
    InMemoryStagingSink,
    StagingSink,
    StagingSource,
)
from rollcap.staging._terminal import (
    TerminalAttribution,
    TerminalSelection,
    attribute_and_receive,
    resolve_terminal,
    select_terminal_call,
)
from rollcap.staging._tokens import (
    LineageDecision,
    LineageResolver,
    TokenCaptureSnapshot,
    TokenCaptureStore,
    TokenEntry,
    TokenSink,
    TokenSource,
    entry_digest,
)

__all__ = [
    "CAPTURE_FAILED",
    "CAPTURE_FIELD",
    "CONFORMANCE_CHECKS",
    "COORDS_FIELD",
    "DEFAULT_CONTROL_TOKEN_ENV",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "FINGERPRINT_VERSION",
    "LINEAGE_MARKER_SUFFIX",
    "LINEAGE_SUFFIX",
    "MANIFEST_PATH_TEMPLATE",
    "MISSING_ROUTE_SENTINEL",
    "PREFIX_IDS_FIELD",
    "REASON_INVALID_WORKER_COMMIT_COORDINATES",
    "REASON_LEDGER_ROW_MISSING_CHAIN_HASH",
    "REASON_LEDGER_ROW_MISSING_RESPONSE_ID",
    "REASON_REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
    "REASON_UNRESOLVED_PARENT",
    "REASON_WORKER_CAPTURE_FAILED",
    "REASON_WORKER_RESPONSE_MISSING_COMMIT_COORDINATES",
    "STAGED",
    "STAGING_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "ActiveCall",
    "CallRecord",
    "CaptureAdapter",
    "CaptureAdmission",
    "CaptureError",
    "CaptureHost",
    "CaptureLedgerCommit",
    "CommitCoords",
    "ConformanceError",
    "DirectoryStagingSink",
    "ExtrasCommitment",
    "FileLineageStore",
    "InMemoryStagingSink",
    "LineageDecision",
    "LineageResolver",
    "LinearizedRow",
    "ManifestFailure",
    "MegatronCaptureAdapter",
    "ParentRow",
    "RebuildError",
    "ReceiptVerificationError",
    "RolloutControlClient",
    "RolloutManifest",
    "RolloutReceipt",
    "RolloutTokenCapture",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCallSnapshot",
    "StagedRecordError",
    "StagingError",
    "StagingSink",
    "StagingSource",
    "StreamingUnsupportedError",
    "TerminalAttribution",
    "TerminalSelection",
    "TokenCaptureSnapshot",
    "TokenCaptureStore",
    "TokenEntry",
    "TokenSink",
    "TokenSource",
    "UnfingerprintableError",
    "VLLMCaptureAdapter",
    "WeightVersionProvider",
    "WeightVersionSpan",
    "assistant_fingerprint",
    "attribute_and_receive",
    "bearer_matches",
    "classify_route_span",
    "compute_chain_hash",
    "compute_extras_digest",
    "compute_staging_digest",
    "conversation_digest",
    "decode_routed_experts",
    "encode_routed_experts",
    "encode_token_ids",
    "entry_digest",
    "failure_row",
    "hash_token_ids",
    "install_capture",
    "ledger_row",
    "linearize",
    "output_fingerprints",
    "parse_staged_record",
    "prepare_engine_request",
    "receipt_for",
    "request_items",
    "resolve_terminal",
    "response_items",
    "run_conformance",
    "select_terminal_call",
    "staging_key",
    "strip_capture_transport_fields",
    "verify_and_linearize",
]
