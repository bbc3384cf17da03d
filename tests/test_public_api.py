"""Freeze the public names: adding one is a decision, removing one breaks users."""

from __future__ import annotations

import rollcap

PUBLIC = {
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
}


def test_exported_names_are_frozen() -> None:
    assert set(rollcap.__all__) == PUBLIC
    for name in rollcap.__all__:
        assert hasattr(rollcap, name), name


def test_exported_objects_live_in_rollcap() -> None:
    for name in rollcap.__all__:
        module = getattr(getattr(rollcap, name), "__module__", "rollcap")
        assert module.startswith("rollcap"), (name, module)
