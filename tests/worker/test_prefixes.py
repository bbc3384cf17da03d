"""The worker's memory of each rollout's last staged call: a continuation's prefix without
reading its chain back, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollcap._runtime.serving import serving
from rollcap.staging import CaptureAdmission, CommitCoords
from rollcap.testing import FakeUpstream
from rollcap.worker import create_worker_app
from rollcap.worker._prefixes import PrefixCache
from tests.worker.conftest import (
    FIRST_QUESTION,
    Worker,
    chat_body,
    child_admission,
    rebuild,
    root_admission,
    settings_for,
)

CHAIN = "3" * 64


def _admission(**change: Any) -> CaptureAdmission:
    fields: dict[str, Any] = {
        "rollout_id": "r",
        "model_call_id": "c2",
        "parent_call_id": "c1",
        "prev_len": 3,
        "mode": "token_in",
        "staging_chain": ["r/c1"],
        "parent_chain_hash": CHAIN,
    }
    return CaptureAdmission.model_validate({**fields, **change})


def test_the_last_call_is_the_next_ones_prefix_and_only_its_own() -> None:
    cache = PrefixCache(max_ids=100)
    assert cache.prefix(_admission()) is None
    cache.remember("r", "c1", "r/c1", CHAIN, [5, 6, 7])
    assert cache.prefix(_admission()) == [5, 6, 7]
    for other in (
        {"parent_call_id": "c0"},
        {"staging_chain": ["r/c0"]},
        {"parent_chain_hash": "4" * 64},
        {"prev_len": 2, "required_prefix_token_ids": []},
        {"rollout_id": "q", "staging_chain": ["q/c1"]},
    ):
        assert cache.prefix(_admission(**other)) is None, other
    inline = _admission(staging_chain=[], required_prefix_token_ids=[5, 6, 7])
    assert cache.prefix(inline) is None  # the admission carries its own ids


def test_the_cache_holds_at_most_its_ids_the_least_recent_rollout_going_first() -> None:
    cache = PrefixCache(max_ids=6)
    cache.remember("a", "c1", "a/c1", CHAIN, [1, 2, 3])
    cache.remember("b", "c1", "b/c1", CHAIN, [1, 2, 3])
    assert cache.prefix(_admission(rollout_id="a", staging_chain=["a/c1"])) == [1, 2, 3]
    cache.remember("c", "c1", "c/c1", CHAIN, [1, 2])
    assert (len(cache), cache.held_ids) == (2, 5)
    assert cache.prefix(_admission(rollout_id="b", staging_chain=["b/c1"])) is None
    cache.remember("a", "c2", "a/c2", CHAIN, [1, 2, 3, 4])  # replaces a's entry
    assert cache.held_ids == 6
    cache.remember("d", "c1", "d/c1", CHAIN, list(range(7)))  # bigger than the whole cache
    assert cache.held_ids == 6
    assert len(PrefixCache(max_ids=0)) == 0
    with pytest.raises(ValueError, match="max_ids"):
        PrefixCache(max_ids=-1)


@pytest.mark.parametrize("cache_ids", [16_000_000, 0])
async def test_a_chain_is_read_back_only_when_the_worker_does_not_remember_its_parent(
    upstream: FakeUpstream, staging_dir: Path, session: aiohttp.ClientSession, cache_ids: int
) -> None:
    app = create_worker_app(
        settings_for(upstream.url + "/v1", staging_dir, prefix_cache_ids=cache_ids)
    )
    inner = app.state.worker
    fetched: list[list[str]] = []
    fetch = inner.sink.fetch

    def counting(keys: list[str]) -> Any:
        fetched.append(keys)
        return fetch(keys)

    inner.sink.fetch = counting
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    chain: list[CommitCoords] = []
    async with serving(app) as url:
        worker = Worker(url, staging_dir, session)
        for call_id in ("c1", "c2", "c3"):
            if chain:
                keys = [c.staging_key for c in chain if c.staging_key is not None]
                capture = child_admission(call_id, chain[-1], keys)
            else:
                capture = root_admission(call_id)
            reply = await worker.post(chat_body(messages, capture))
            assert reply.coords.staged
            chain.append(reply.coords)
            content = reply.answer["choices"][0]["message"]["content"]
            messages += [
                {"role": "assistant", "content": content},
                {"role": "user", "content": "And then?"},
            ]
    # The pinned ids are the chain's either way: the trainer's rebuild accepts it.
    assert rebuild(staging_dir, chain).model_call_ids == ["c1", "c2", "c3"]
    if cache_ids:
        assert fetched == []
    else:
        assert fetched == [["r-0/c1"], ["r-0/c1", "r-0/c2"]]
