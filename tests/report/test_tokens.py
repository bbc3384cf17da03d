"""The token view's data, from linearized chains."""

from __future__ import annotations

from rollcap.report._tokens import token_payload
from rollcap.staging import LinearizedChain

CHAIN = LinearizedChain(
    rollout_id="0-0",
    model_call_ids=("a" * 32, "b" * 32),
    token_ids=[1, 72, 2, 1, 73, 2],
    loss_mask=[0, 1, 1, 0, 1, 1],
    logprobs=[0.0, -0.123456789, -1.0, 0.0, -2.000049, -0.5],
    weight_versions=(3, 3),
    prev_lens=(0, 3),
    cum_lens=(3, 6),
    chain_hash="c" * 64,
)


def test_a_chain_keeps_ids_masks_boundaries_and_rounded_logprobs() -> None:
    view = token_payload([CHAIN], {"a" * 32: None, "b" * 32: "digest mismatch"})
    assert view["error"] is None
    assert view["checks"] == {"a" * 32: None, "b" * 32: "digest mismatch"}
    (chain,) = view["chains"]
    assert chain == {
        "calls": ["a" * 32, "b" * 32],
        "ids": [1, 72, 2, 1, 73, 2],
        "mask": [0, 1, 1, 0, 1, 1],
        "logprobs": [0.0, -0.1235, -1.0, 0.0, -2.0, -0.5],
        "prev_lens": [0, 3],
        "cum_lens": [3, 6],
        "weight_versions": [3, 3],
        "chain_hash": "c" * 64,
    }


def test_a_rollout_that_does_not_linearize_says_why() -> None:
    view = token_payload([], {}, "staged call x: parent y is missing")
    assert view == {"error": "staged call x: parent y is missing", "checks": {}, "chains": []}
