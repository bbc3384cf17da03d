"""rollcap: model-call capture for LLM agent evaluation and RL training.

The public API is what this module exports; everything else is internal and may change.
"""

from rollcap.affinity import choose_replica
from rollcap.attachment import build_attachment, capture_attachment
from rollcap.ids import build_rollout_id, rollout_id_from_run, validate_rollout_id
from rollcap.metrics import aggregate
from rollcap.records import ErrorCategory, Gap, ModelCallRecord, RawRecord, error_category
from rollcap.routing import base_url_for_run, url_path_for_request, url_path_for_run
from rollcap.store import (
    AvailableRecords,
    CaptureReadError,
    CaptureStore,
    aggregate_model_call_metrics,
    read_model_call_records,
)
from rollcap.workflow import resolve_model_base_url

__version__ = "0.1.0"

__all__ = [
    "AvailableRecords",
    "CaptureReadError",
    "CaptureStore",
    "ErrorCategory",
    "Gap",
    "ModelCallRecord",
    "RawRecord",
    "__version__",
    "aggregate",
    "aggregate_model_call_metrics",
    "base_url_for_run",
    "build_attachment",
    "build_rollout_id",
    "capture_attachment",
    "choose_replica",
    "error_category",
    "read_model_call_records",
    "resolve_model_base_url",
    "rollout_id_from_run",
    "url_path_for_request",
    "url_path_for_run",
    "validate_rollout_id",
]
