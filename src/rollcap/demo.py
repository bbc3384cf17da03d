"""``make demo`` until the evaluation workflow lands: real calls through a capturing model server.

A fake upstream (``rollcap.testing``) plays the model. Two rollcap model servers sit in front of
it, ``openai_model`` and ``anthropic_model``, with capture on. Calls in all three dialects, some
streamed, go through the servers over real sockets under ``/ng-rollout/<id>/`` prefixes, as an
agent's SDK would send them; then the capture is read back, normalized and aggregated, as
rollout collection will do.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from rollcap._serving import serving
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.store import CaptureStore, capture_attachment
from rollcap.testing import FakeUpstream

KEY = "demo-upstream-key"

# (rollout, server, route, scenario, streamed)
CALLS = [
    ("0-0", "openai", "/v1/responses", "text", False),
    ("0-0", "openai", "/v1/chat/completions", "tool", True),
    ("0-0", "anthropic", "/v1/messages", "reasoning", True),
    ("1-0", "openai", "/v1/chat/completions", "truncate", True),
    ("1-0", "anthropic", "/v1/messages", "http_429", False),
    (None, "openai", "/v1/chat/completions", "text", False),  # forgot the prefix
]


def _body(route: str, streamed: bool) -> dict[str, Any]:
    question = "Which option is correct: A, B or C?"
    tool = {"type": "object", "properties": {"letter": {"type": "string"}}}
    if route == "/v1/responses":
        return {"model": "demo-model", "input": question, "stream": streamed}
    if route == "/v1/chat/completions":
        return {
            "model": "demo-model",
            "messages": [{"role": "user", "content": question}],
            "tools": [{"type": "function", "function": {"name": "answer", "parameters": tool}}],
            "stream": streamed,
            "stream_options": {"include_usage": True},
        }
    return {
        "model": "demo-model",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": question}],
        "stream": streamed,
    }


async def _run(directory: Path) -> dict[str, Any]:
    async with FakeUpstream(api_key=KEY) as upstream:
        settings = {
            "openai": ModelServerSettings(
                "openai_model", f"{upstream.url}/v1", api_key=KEY, capture_dir=directory
            ),
            "anthropic": ModelServerSettings(
                "anthropic_model", upstream.url, api_key=KEY, capture_dir=directory
            ),
        }
        async with (
            serving(create_model_app(settings["openai"])) as openai_url,
            serving(create_model_app(settings["anthropic"])) as anthropic_url,
            aiohttp.ClientSession() as session,
        ):
            urls = {"openai": openai_url, "anthropic": anthropic_url}
            for rollout, server, route, scenario, streamed in CALLS:
                prefix = f"/ng-rollout/{rollout}" if rollout else ""
                headers = {"x-fake-scenario": scenario, "anthropic-version": "2023-06-01"}
                async with session.post(
                    urls[server] + prefix + route, json=_body(route, streamed), headers=headers
                ) as response:
                    # The upstream cuts one stream on purpose; the client sees it cut too.
                    with contextlib.suppress(aiohttp.ClientPayloadError):
                        await response.read()
            async with session.get(f"{openai_url}/health") as response:
                health: dict[str, Any] = await response.json()
    return health


def main() -> int:
    directory = Path("results/demo-model-calls").resolve()
    store = CaptureStore(directory)
    for rollout_id in ("0-0", "1-0"):
        store.clear(rollout_id)
    print("rollcap demo: a fake model behind two capturing model servers, calls over 127.0.0.1\n")
    health = asyncio.run(_run(directory))

    for rollout_id in store.rollout_ids():
        attachment = capture_attachment(store, rollout_id, payloads=False)
        print(f"rollout {rollout_id}: metrics {orjson.dumps(attachment['metrics']).decode()}")
        for call in attachment["calls"]:
            print(
                f"  call {call['call_index']}: {call['dialect']:<9} status={call['status_code']}"
                f" tokens_in={call['tokens_in']} tokens_out={call['tokens_out']}"
                f" finish={call['finish_reason']} error={call['error_category']}"
                f" tool_calls={orjson.dumps(call['tool_calls']).decode()}"
                f" reasoning={'yes' if call['reasoning_content'] else 'no'}"
            )
        for gap in attachment.get("gaps", []):
            print(f"  gap: {gap['code']}")
    print(
        f"\nopenai_model server /health: captured={health['captured']}"
        f" uncorrelated={health['uncorrelated']} (a call without the /ng-rollout/ prefix)"
    )
    print(f"capture files: {directory}/")
    for rollout_id in store.rollout_ids():
        print(f"  {store.path_for(rollout_id)}")
    print(f"inspect one:   .venv/bin/rollcap capture show {directory} 0-0 --no-payloads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
