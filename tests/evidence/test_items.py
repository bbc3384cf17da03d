from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollcap.evidence._items import OTHER_ITEM_TYPES, normalize_item

CASES = json.loads((Path(__file__).parent / "fixtures" / "conversation_items.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[case["rule"] for case in CASES])
def test_common_items_are_written_back_as_their_shape(case: dict[str, Any]) -> None:
    written = normalize_item(case["sent"])
    assert written == case["written"]
    assert list(written) == list(case["written"])  # the order is part of the format
    assert normalize_item(written) == written  # written back again, unchanged


def test_an_assistant_message_with_a_string_is_a_plain_message() -> None:
    item = normalize_item({"role": "assistant", "content": "done", "phase": "final_answer"})
    assert item == {
        "content": "done",
        "role": "assistant",
        "type": "message",
        "phase": "final_answer",
    }


def test_a_policy_item_keeps_its_token_ids() -> None:
    item = normalize_item(
        {
            "type": "function_call",
            "call_id": "c",
            "name": "f",
            "arguments": "{}",
            "prompt_token_ids": [1, 2],
            "generation_token_ids": [3],
            "generation_log_probs": [-0.5],
        }
    )
    assert item["prompt_token_ids"] == [1, 2]
    assert item["generation_log_probs"] == [-0.5]
    assert item["routed_experts"] is None


@pytest.mark.parametrize(
    "item",
    [
        {"role": "tool", "content": "x"},
        {"type": "function_call", "name": "f"},
        {"type": "function_call_output", "call_id": "c", "output": 3},
        {"type": "message", "role": "user", "content": [{"type": "output_text", "text": "x"}]},
        {"type": "turn"},
        {"content": "no role"},
        "a string",
        ["a", "list"],
    ],
)
def test_an_item_that_fits_no_shape_is_refused(item: object) -> None:
    with pytest.raises(ValueError, match="item"):
        normalize_item(item)


@pytest.mark.parametrize("item_type", sorted(OTHER_ITEM_TYPES))
def test_other_item_types_pass_through_as_sent(item_type: str) -> None:
    item = {"type": item_type, "id": "x", "anything": [1, {"b": None}]}
    assert normalize_item(item) == item
