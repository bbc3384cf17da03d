"""The token view's data: a rollout's linearized chains and each staged call's check (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.staging import LinearizedChain

__all__ = ["LOGPROB_DIGITS", "token_payload"]

# Enough to colour a cell and read its value; the exact floats stay in the staging records.
LOGPROB_DIGITS = 4


def token_payload(
    chains: Sequence[LinearizedChain],
    checks: Mapping[str, str | None],
    error: str | None = None,
) -> dict[str, Any]:
    """The token view of one rollout.

    ``checks`` maps each staged call to ``None`` when its digests verified, else why not;
    ``error`` is why the rollout could not be linearized (then ``chains`` is empty).
    """
    return {
        "error": error,
        "checks": dict(checks),
        "chains": [
            {
                "calls": list(chain.model_call_ids),
                "ids": chain.token_ids,
                "mask": chain.loss_mask,
                "logprobs": [round(value, LOGPROB_DIGITS) for value in chain.logprobs],
                "prev_lens": list(chain.prev_lens),
                "cum_lens": list(chain.cum_lens),
                "weight_versions": list(chain.weight_versions),
                "chain_hash": chain.chain_hash,
            }
            for chain in chains
        ],
    }
