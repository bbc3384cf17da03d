"""The whole RL path on real sockets: client -> model server (the gate) -> worker -> engine.

The gate is tested on its own in ``tests/server/test_staged.py``; here only what the worker
must give it: coords the gate commits, records the trainer rebuilds from the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rollcap._runtime.serving import serving
from rollcap.config import TokenCaptureSettings
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.staging import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    DEFAULT_CONTROL_TOKEN_ENV,
    PREFIX_IDS_FIELD,
    DirectoryStagingSink,
    RolloutControlClient,
    attribute_and_receive,
    verify_and_linearize,
)
from rollcap.testing import FakeUpstream, encode, render_prompt
from tests.worker.conftest import CHAT, FIRST_QUESTION, settings_for, worker_at

CONTROL_TOKEN = "control-token-for-tests"


async def test_a_three_turn_rollout_rebuilds_from_the_manifest(
    upstream: FakeUpstream,
    tmp_path: Path,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DEFAULT_CONTROL_TOKEN_ENV, CONTROL_TOKEN)
    staging_dir = tmp_path / "staging"
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST_QUESTION}]
    answers: list[dict[str, Any]] = []
    async with worker_at(settings_for(upstream.url + "/v1", staging_dir)) as worker_url:
        model = ModelServerSettings(
            model_type="vllm_model",
            base_url=worker_url + "/v1",
            token_capture=TokenCaptureSettings(
                enabled=True, external_staging=True, dir=tmp_path / "ledger"
            ),
        )
        async with serving(create_model_app(model)) as model_url:
            for turn in range(3):
                async with session.post(
                    f"{model_url}/ng-rollout/m-0/training-token-capture{CHAT}",
                    json={"model": "fake-model", "messages": messages},
                ) as response:
                    assert response.status == 200, await response.text()
                    answer = await response.json()
                assert COORDS_FIELD not in answer
                assert "prompt_token_ids" not in answer
                answers.append(answer)
                content = answer["choices"][0]["message"]["content"]
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": f"Then ({turn})?"},
                ]
            async with RolloutControlClient(
                model_url, auth_token=CONTROL_TOKEN, request_timeout_s=30
            ) as control:
                manifest = await control.manifest("m-0")

    assert manifest.failures == []
    assert [r.prev_len > 0 for r in manifest.records] == [False, True, True]
    chats = [r.json for r in upstream.requests if r.path == CHAT]
    assert len(chats) == 3
    assert not any(CAPTURE_FIELD in body for body in chats)
    assert PREFIX_IDS_FIELD not in chats[0]
    for parent, body in zip(manifest.records[:-1], chats[1:], strict=True):
        assert len(body[PREFIX_IDS_FIELD]) == parent.cum_len
    receipt = attribute_and_receive(manifest, declared_response_id=answers[-1]["id"])
    keys = [r.staging_key for r in manifest.records]
    row = verify_and_linearize(receipt, DirectoryStagingSink(staging_dir).fetch(keys))
    assert len(row.model_call_ids) == 3
    last_answer = [*encode(messages[-2]["content"]), 2]
    last_prompt = render_prompt(messages[:-2], prefix_ids=chats[-1][PREFIX_IDS_FIELD])
    assert row.token_ids == last_prompt + last_answer
    assert row.token_mask.count(1.0) == sum(
        len(encode(a["choices"][0]["message"]["content"])) + 1 for a in answers
    )
