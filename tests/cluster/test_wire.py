from __future__ import annotations

import pytest

from rollcap.cluster._wire import (
    OUTCOME_HEADER,
    UNREACHABLE_HEADER,
    decode_outcome,
    decode_request,
    encode_request,
    outcome_headers,
)
from rollcap.collect import Rollout, RolloutOutcome


def test_a_rollout_crosses_whole() -> None:
    rollout = Rollout(7, 2, 1, {"question": "é?", "nested": {"a": [1, 2]}})
    assert decode_request(encode_request(rollout, "replica", "http://r:1")) == (
        rollout,
        "replica",
        "http://r:1",
    )


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"task": 1, "kind": "a", "target": "b"}', "task must be a JSON object"),
        (b'{"task": {}, "kind": 1, "target": "b"}', "kind and target"),
        (
            b'{"task": {}, "kind": "a", "target": "b", "task_index": -1}',
            "task_index must be an integer",
        ),
    ],
)
def test_a_malformed_request_is_refused(raw: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_request(raw)


def test_an_outcome_crosses_with_its_line_untouched() -> None:
    line = b'{"rollout_id": "0-0", "reward": 1.0}\n'
    for outcome in (
        RolloutOutcome(RolloutOutcome.OK, line),
        RolloutOutcome(RolloutOutcome.FAILED, line, model_unreachable=True),
    ):
        headers = outcome_headers(outcome)
        assert decode_outcome(headers, line) == outcome
    assert outcome_headers(RolloutOutcome(RolloutOutcome.OK, line)).get(UNREACHABLE_HEADER) is None
    for headers, body in (
        ({OUTCOME_HEADER: "lost"}, line),  # a worker never answers lost: that is the driver's
        ({}, line),
        ({OUTCOME_HEADER: "ok"}, b"{}"),  # not a whole line
    ):
        with pytest.raises(ValueError, match="not a rollout outcome"):
            decode_outcome(headers, body)
