from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from rollcap.collect import CollectionSummary
from rollcap.workflow import Progress, format_summary


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_logs_prints_a_line_every_tenth() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    for done in range(101):
        progress(done, 0, 100)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 11
    assert lines[-1].startswith("100/100 rollouts, 0 failed")


def test_progress_on_a_terminal_draws_a_bar_with_rate_and_eta() -> None:
    stream = _Terminal()
    progress = Progress(stream)
    for done in range(0, 51, 10):
        progress(done, 1, 50)
    progress.close()
    out = stream.getvalue()
    assert "50/50" in out
    assert "1 failed" in out
    assert "ETA" in out


async def test_run_eval_calls_on_started_once_servers_are_up_and_before_any_rollout(
    tmp_path: Path,
) -> None:
    from rollcap.config import load_config
    from rollcap.gym import example_data_path
    from rollcap.testing import FakeUpstream
    from rollcap.workflow import EvalRequest, run_eval
    from tests.conftest import SECRETS

    output = tmp_path / "out.jsonl"
    seen: list[bool] = []
    async with FakeUpstream(api_key=SECRETS[0]) as upstream:
        config = load_config(
            overrides=[f"++policy_base_url={upstream.url}/v1", f"++policy_api_key={SECRETS[0]}"],
            env_file=None,
        )
        request = EvalRequest(
            agent="mcqa_simple_agent",
            input_path=example_data_path("mcqa"),
            output_path=output,
            limit=2,
            model_type="openai_model",
            head_port=0,
        )
        summary, _ = await run_eval(
            request,
            config,
            on_started=lambda: seen.append(output.exists() and bool(upstream.requests)),
        )
    assert seen == [False]  # called once, before the first rollout reached the model
    assert summary.ran == 2


def test_the_summary_says_how_many_rollouts_were_lost_and_what_to_do(tmp_path: Path) -> None:
    keys = "rollouts mean_reward num_calls tokens_in tokens_out tokens_reasoning cached_tokens"
    keys += " latency_p50_ms latency_p90_ms latency_p99_ms rollouts_without_calls"
    metrics = dict.fromkeys(keys.split())
    summary = CollectionSummary(
        tmp_path / "o.jsonl", tmp_path / "f", tmp_path / "m", 10, 10, 0, 0, metrics, lost=3
    )
    text = format_summary(summary, None)
    assert "LOST: 3 rollout(s)" in text
    assert "--resume" in text
    assert "LOST" not in format_summary(replace(summary, lost=0), None)


async def test_a_run_s_request_params_reach_the_model_and_its_lines(tmp_path: Path) -> None:
    from rollcap.config import load_config
    from rollcap.gym import example_data_path
    from rollcap.testing import FakeUpstream
    from rollcap.workflow import EvalRequest, run_eval
    from tests.conftest import SECRETS

    output = tmp_path / "out.jsonl"
    async with FakeUpstream(api_key=SECRETS[0]) as upstream:
        config = load_config(
            overrides=[
                f"++policy_base_url={upstream.url}/v1",
                f"++policy_api_key={SECRETS[0]}",
                "++responses_create_params.temperature=0.7",
                "++rollout_seed=40",
            ],
            env_file=None,
        )
        request = EvalRequest(
            agent="mcqa_simple_agent",
            input_path=example_data_path("mcqa"),
            output_path=output,
            limit=2,
            num_repeats=3,
            model_type="openai_model",
            head_port=0,
        )
        await run_eval(request, config)
    sent = sorted(
        (r.json["input"][0]["content"][:20], r.json["seed"], r.json["temperature"])
        for r in upstream.requests
        if r.path.endswith("/responses")
    )
    questions = sorted({question for question, _, _ in sent})
    assert len(questions) == 2
    assert sent == [(q, seed, 0.7) for q in questions for seed in (40, 41, 42)]
    lines = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    assert [(line["rollout_id"], line["responses_create_params"]["seed"]) for line in lines] == [
        ("0-0", 40),
        ("0-1", 41),
        ("0-2", 42),
        ("1-0", 40),
        ("1-1", 41),
        ("1-2", 42),
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("++responses_create_params=0.7", "responses_create_params must be a mapping"),
        ("++rollout_seed=-1", "rollout_seed must be an integer >= 0"),
        ("++rollout_seed=one", "rollout_seed must be an integer >= 0"),
    ],
)
def test_bad_request_params_are_a_config_error_naming_the_key(override: str, message: str) -> None:
    from rollcap.config import ConfigError, load_config
    from rollcap.workflow._run import request_params

    with pytest.raises(ConfigError, match=message):
        request_params(load_config(overrides=[override], env_file=None))
    assert request_params(load_config(env_file=None)).empty
