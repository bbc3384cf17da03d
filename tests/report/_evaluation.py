"""A small real evaluation for the report tests: official SDKs -> capturing model servers ->
the fake upstream, into an ``eval submit``-style job directory (``rollouts.jsonl`` and
``model-calls/``).

The rollouts cover every kind of call the report shows:

- task 0, rollouts ``0-0`` and ``0-1`` (chat): a tool call, then streamed reasoning, then a
  follow-up that differs between the two, so they diverge at call 2 (``DIVERGE_AT``);
- task 1, rollout ``1-0`` (Responses): a streamed text, a 429, the same request again; and a
  torn last line, as a crash leaves it;
- task 2, rollout ``2-0`` (Anthropic Messages): streamed thinking, a stream cut short, a stream
  error event; the rollout failed (a failures-file line);
- task 3, rollout ``3-0`` (chat, RL): two training calls
  (``/ng-rollout/<id>/training-token-capture``) through the staging gate and a capture worker
  (weights ``WEIGHT_VERSION``), which stages their token ids into ``staging/``; the gate's
  ledger (``3-0.lineage.jsonl``) lands in the capture directory, its default place (the token
  view).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import orjson

from rollcap._runtime.serving import serving_in_thread
from rollcap.collect import Rollout, failure_line, failures_path, rollout_line
from rollcap.config import TokenCaptureSettings
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.testing import HEADER_SCENARIO, FakeUpstream
from rollcap.worker import WorkerSettings, create_worker_app

UPSTREAM_KEY = "report-upstream-key"
CONTROL_TOKEN = "report-control-token"
WEIGHT_VERSION = 7
DIVERGE_AT = 2
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_capital",
            "description": "Look up a country's capital",
            "parameters": {
                "type": "object",
                "properties": {"country": {"type": "string", "enum": ["France"]}},
                "required": ["country"],
            },
        },
    }
]
# rollout id -> (calls, error categories of its calls in order)
EXPECTED_CALLS = {"0-0": 3, "0-1": 4, "1-0": 3, "2-0": 3, "3-0": 2}
EXPECTED_ERRORS: dict[str, list[str | None]] = {
    "0-0": [None, None, None],
    "0-1": [None, None, None, None],
    "1-0": [None, "rate_limit", None],
    "2-0": [None, "stream_truncated", "upstream_error"],
    "3-0": [None, None],
}
STREAMED: dict[str, list[int]] = {
    "0-0": [0, 1, 1],
    "0-1": [0, 1, 1, 1],
    "1-0": [1, 0, 0],
    "2-0": [1, 1, 1],
    "3-0": [0, 1],
}


def _scenario(name: str) -> dict[str, str]:
    return {HEADER_SCENARIO: name}


@dataclass
class Evaluation:
    """The job directory and the servers that write into it."""

    job_dir: Path
    openai_url: str
    anthropic_url: str
    staged_url: str
    http: httpx2.Client
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def capture_dir(self) -> Path:
        return self.job_dir / "model-calls"

    @property
    def rollouts_file(self) -> Path:
        return self.job_dir / "rollouts.jsonl"

    @property
    def staging_dir(self) -> Path:
        return self.job_dir / "staging"

    def openai(self, rollout_id: str, *, staged: bool = False) -> openai.OpenAI:
        # Only a training call (the training-token-capture segment) is staged.
        base = (
            f"{self.staged_url}/ng-rollout/{rollout_id}/training-token-capture"
            if staged
            else f"{self.openai_url}/ng-rollout/{rollout_id}"
        )
        return openai.OpenAI(
            base_url=f"{base}/v1",
            api_key="client-key",
            max_retries=0,
            http_client=self.http,
        )

    def anthropic(self, rollout_id: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=f"{self.anthropic_url}/ng-rollout/{rollout_id}",
            api_key="client-key",
            max_retries=0,
            http_client=self.http,
        )

    def finish(self, task: int, index: int, reward: float) -> None:
        rollout = Rollout(task, index, 0, {"question": "What is the capital of France?"})
        line = rollout_line(rollout, {"response": {"text": "Paris"}, "reward": reward})
        with self.rollouts_file.open("ab") as handle:
            handle.write(orjson.dumps(line) + b"\n")

    def fail(self, task: int, index: int, message: str) -> None:
        rollout = Rollout(task, index, 0, {"question": "What is the capital of France?"})
        line = failure_line(rollout, "agent_error", message)
        with failures_path(self.rollouts_file).open("ab") as handle:
            handle.write(orjson.dumps(line) + b"\n")

    def chat_rollout(self, index: int, follow_ups: list[str], reward: float) -> None:
        """Task 0: a tool call, streamed reasoning, then the follow-ups (streamed text)."""
        client = self.openai(f"0-{index}")
        messages: list[Any] = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        first = client.chat.completions.create(
            model="fake-model", messages=messages, tools=TOOLS, extra_headers=_scenario("tool")
        )
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "Paris"})
        scenario = "reasoning"
        for follow_up in [None, *follow_ups]:
            if follow_up is not None:
                messages.append({"role": "user", "content": follow_up})
                scenario = "text"
            stream = client.chat.completions.create(
                model="fake-model",
                messages=messages,
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=_scenario(scenario),
            )
            text = "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )
            messages.append({"role": "assistant", "content": text})
        self.finish(0, index, reward)

    def responses_rollout(self) -> None:
        """Task 1: a streamed text, a 429, the same request again; then a torn line."""
        client = self.openai("1-0")
        with client.responses.stream(model="fake-model", input="Name a city.") as stream:
            answer = stream.get_final_response().output_text
        follow_up: Any = [
            {"role": "user", "content": "Name a city."},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And another one?"},
        ]
        with contextlib.suppress(openai.RateLimitError):
            client.responses.create(
                model="fake-model", input=follow_up, extra_headers=_scenario("http_429")
            )
        client.responses.create(model="fake-model", input=follow_up)
        self.finish(1, 0, 1.0)

    def messages_rollout(self) -> None:
        """Task 2: streamed thinking, a cut stream, a stream error; the rollout failed."""
        client = self.anthropic("2-0")
        messages: Any = [{"role": "user", "content": "Think, then answer: 2 + 2?"}]
        with client.messages.stream(
            model="fake-model",
            max_tokens=2048,
            messages=messages,
            thinking={"type": "enabled", "budget_tokens": 1024},
            extra_headers=_scenario("reasoning"),
        ) as stream:
            stream.get_final_message()
        for scenario in ("truncate", "stream_error"):
            with (
                contextlib.suppress(anthropic.APIError, httpx2.HTTPError),
                client.messages.stream(
                    model="fake-model",
                    max_tokens=256,
                    messages=messages,
                    extra_headers=_scenario(scenario),
                ) as stream,
            ):
                stream.get_final_message()
        self.fail(2, 0, "the model stream broke off </b>")

    def staged_rollout(self) -> None:
        """Task 3: two training calls, the second continuing the first; the worker stages both."""
        client = self.openai("3-0", staged=True)
        messages: list[Any] = [{"role": "user", "content": "Say hello."}]
        first = client.chat.completions.create(model="fake-model", messages=messages)
        messages.append({"role": "assistant", "content": first.choices[0].message.content})
        messages.append({"role": "user", "content": "Once more."})
        stream = client.chat.completions.create(model="fake-model", messages=messages, stream=True)
        for _ in stream:
            pass
        self.finish(3, 0, 0.5)


@contextlib.contextmanager
def _control_token() -> Iterator[None]:
    """The gate's control-route token in its environment variable while the app is made."""
    name = TokenCaptureSettings().control_auth_token_env
    before = os.environ.get(name)
    os.environ[name] = CONTROL_TOKEN
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


@contextlib.contextmanager
def evaluation_servers(job_dir: Path) -> Iterator[Evaluation]:
    """A fake upstream, an OpenAI-type and an Anthropic-type capturing model server, and a
    staging gate (a vllm_model server with external staging) in front of a capture worker."""
    capture_dir = job_dir / "model-calls"
    with FakeUpstream.running_in_thread(api_key=UPSTREAM_KEY) as upstream:

        def settings(model_type: str) -> ModelServerSettings:
            return ModelServerSettings(
                model_type=model_type,
                base_url=upstream.url + "/v1",
                api_key=UPSTREAM_KEY,
                capture_dir=capture_dir,
            )

        worker = create_worker_app(
            WorkerSettings(
                upstream_url=upstream.url,
                staging_dir=job_dir / "staging",
                api_key=UPSTREAM_KEY,
                weight_version=WEIGHT_VERSION,
            )
        )
        with (
            _control_token(),
            serving_in_thread(create_model_app(settings("openai_model"))) as openai_url,
            serving_in_thread(create_model_app(settings("anthropic_model"))) as anthropic_url,
            serving_in_thread(worker) as worker_url,
            serving_in_thread(
                create_model_app(
                    ModelServerSettings(
                        model_type="vllm_model",
                        base_url=worker_url + "/v1",
                        capture_dir=capture_dir,
                        token_capture=TokenCaptureSettings(
                            enabled=True, external_staging=True, dir=capture_dir
                        ),
                    )
                )
            ) as staged_url,
            httpx2.Client(timeout=30) as http,
        ):
            yield Evaluation(job_dir, openai_url, anthropic_url, staged_url, http)


def run_evaluation(job_dir: Path) -> None:
    """Every rollout of the module docstring, into ``job_dir``."""
    job_dir.mkdir(parents=True, exist_ok=True)
    with evaluation_servers(job_dir) as run:
        run.chat_rollout(0, ["Are you sure?"], 1.0)
        run.chat_rollout(1, ["Explain your answer.", "Thanks."], 0.0)
        run.responses_rollout()
        run.messages_rollout()
        run.staged_rollout()
    with (job_dir / "model-calls" / "1-0.capture.jsonl").open("ab") as handle:
        handle.write(b'{"model_call_id": "torn')
