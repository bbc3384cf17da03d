from __future__ import annotations

import copy
from typing import Any

from rollcap.evidence import rollout_for_export


def test_export_drops_the_trajectory_and_payloads_and_moves_the_capture_last() -> None:
    line: dict[str, Any] = {
        "response": {"output": []},
        "ng_model_call_capture": {
            "rollout_id": "0-0",
            "calls": [
                {"model_call_id": "a", "request": {}, "response_raw": "x", "tokens_in": 1},
                7,
            ],
            "metrics": {},
        },
        "ng_trajectory": {"turns": []},
        "ng_agent_observations": {"source": "s"},
        "ng_perf": {"num_turns": 1},
        "reward": 0.5,
    }
    stored = copy.deepcopy(line)
    view = rollout_for_export(line)
    assert list(view) == [
        "response",
        "ng_agent_observations",
        "ng_perf",
        "reward",
        "ng_model_call_capture",
    ]
    assert view["ng_model_call_capture"] == {
        "rollout_id": "0-0",
        "calls": [{"model_call_id": "a", "tokens_in": 1}],
        "metrics": {},
    }
    assert view["response"] is line["response"]
    assert line == stored


def test_export_of_odd_capture_values() -> None:
    assert rollout_for_export({"ng_model_call_capture": None, "a": 1}) == {"a": 1}
    no_list = rollout_for_export({"ng_model_call_capture": {"calls": "x", "metrics": {}}})
    assert no_list == {"ng_model_call_capture": {"metrics": {}}}
    assert rollout_for_export({"ng_model_call_capture": {}}) == {"ng_model_call_capture": {}}
