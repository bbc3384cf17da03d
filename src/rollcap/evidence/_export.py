"""The export view of a rollout: what goes to experiment trackers (pure).

``rollout_for_export(result)`` is a shallow copy without ``ng_trajectory`` and with
``ng_model_call_capture`` moved to the end, its calls copied without payloads; the agent's
observations, ``ng_perf`` and the response stay (EVIDENCE.md section 10). The stored rollout
is not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollcap.evidence._codes import CAPTURE_KEY, PAYLOAD_KEYS, TRAJECTORY_KEY

__all__ = ["rollout_for_export"]


def rollout_for_export(result: Mapping[str, Any]) -> dict[str, Any]:
    """The sanitized copy of one rollout line for W&B or MLflow tables."""
    out = {key: value for key, value in result.items() if key not in (TRAJECTORY_KEY, CAPTURE_KEY)}
    capture = result.get(CAPTURE_KEY)
    if isinstance(capture, dict):
        view = dict(capture)
        calls = view.get("calls")
        if isinstance(calls, list):
            view["calls"] = [
                {key: value for key, value in call.items() if key not in PAYLOAD_KEYS}
                for call in calls
                if isinstance(call, dict)
            ]
        else:
            view.pop("calls", None)
        out[CAPTURE_KEY] = view
    return out
