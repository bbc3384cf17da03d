"""Responses over WebSocket against HTTP streaming, direct and through rollcap, in one run.

    .venv/bin/python bench/websocket.py [--tool-turns N] [--conversations N] [--concurrent N]

Everything runs on this machine: the fake upstream (``python -m rollcap.testing``) and a rollcap
model server with capture on (``rollcap serve model``, ``openai_model``) in processes of their
own, the client here, all over 127.0.0.1. One conversation is a tool loop of ``--tool-turns``
tool calls and the answer (the fake's ``tool_turns`` scenario, zero upstream delay). Over a
WebSocket each turn sends only the tool's output with ``previous_response_id``, on one socket;
over HTTP each turn is a streamed ``POST /v1/responses`` with the whole conversation so far,
as an agent without server state sends it. Reported: the p50 and p99 of one turn (send to the
terminal event) and of a whole conversation, sequentially, and turns per second with
``--concurrent`` conversations at once; each through rollcap beside the same transport direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from _procs import server_url, started

BIN = Path(sys.executable).parent
KEY = "bench-key"
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[str]:
    with started(args) as (_, lines):
        yield server_url(lines[0])


def _tool_outputs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": "7"}
        for item in response["output"]
        if item["type"] == "function_call"
    ]


async def _socket_conversation(
    session: aiohttp.ClientSession, base: str, turns: int, timings: list[float]
) -> None:
    headers = {"authorization": f"Bearer {KEY}", "x-fake-tool-turns": str(turns)}
    async with session.ws_connect(base + "/v1/responses", headers=headers) as socket:
        event: dict[str, Any] = {
            "type": "response.create",
            "model": "tool_turns",
            "store": False,
            "input": [{"role": "user", "content": "Use the tool, then answer."}],
            "tools": TOOLS,
        }
        while True:
            start = time.perf_counter()
            await socket.send_str(orjson.dumps(event).decode())
            while True:
                message = orjson.loads((await socket.receive()).data)
                if message["type"] in TERMINAL:
                    break
            timings.append(time.perf_counter() - start)
            response = message["response"]
            outputs = _tool_outputs(response)
            if not outputs:
                return
            event = {
                "type": "response.create",
                "model": "tool_turns",
                "store": False,
                "previous_response_id": response["id"],
                "input": outputs,
                "tools": TOOLS,
            }


async def _http_conversation(
    session: aiohttp.ClientSession, base: str, turns: int, timings: list[float]
) -> None:
    headers = {"authorization": f"Bearer {KEY}", "x-fake-tool-turns": str(turns)}
    conversation: list[Any] = [{"role": "user", "content": "Use the tool, then answer."}]
    while True:
        body = {
            "model": "tool_turns",
            "store": False,
            "stream": True,
            "input": conversation,
            "tools": TOOLS,
        }
        start = time.perf_counter()
        async with session.post(
            base + "/v1/responses", data=orjson.dumps(body), headers=headers
        ) as r:
            raw = await r.read()
        timings.append(time.perf_counter() - start)
        completed = [
            orjson.loads(line[6:])
            for line in raw.split(b"\n")
            if line.startswith(b"data: ") and b'"response.completed"' in line
        ]
        response = completed[-1]["response"]
        outputs = _tool_outputs(response)
        if not outputs:
            return
        conversation = [*conversation, *response["output"], *outputs]


CONVERSATIONS = {"websocket": _socket_conversation, "http stream": _http_conversation}


async def _measure(name: str, base: str, args: argparse.Namespace) -> dict[str, float]:
    conversation = CONVERSATIONS[name.split(", ")[1]]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        turn_times: list[float] = []
        whole: list[float] = []
        await conversation(session, base, args.tool_turns, [])  # warm up
        for _ in range(args.conversations):
            start = time.perf_counter()
            await conversation(session, base, args.tool_turns, turn_times)
            whole.append(time.perf_counter() - start)
        concurrent: list[float] = []
        start = time.perf_counter()
        await asyncio.gather(
            *(
                conversation(session, base, args.tool_turns, concurrent)
                for _ in range(args.concurrent)
            )
        )
        elapsed = time.perf_counter() - start
    turn_times.sort()
    whole.sort()
    return {
        "turn_p50": statistics.median(turn_times) * 1000,
        "turn_p99": turn_times[int(0.99 * (len(turn_times) - 1))] * 1000,
        "conversation_p50": statistics.median(whole) * 1000,
        "turns_per_s": len(concurrent) / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool-turns", type=int, default=20, help="tool calls per conversation")
    parser.add_argument("--conversations", type=int, default=30, help="sequential conversations")
    parser.add_argument("--concurrent", type=int, default=32, help="conversations at once")
    args = parser.parse_args()
    capture_dir = Path(tempfile.mkdtemp(prefix="rollcap-bench-websocket-"))
    serve = [str(BIN / "rollcap"), "serve", "model", "--model-type", "openai_model", "--port", "0"]
    try:
        with _process(
            [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        ) as up:
            on = [
                *serve,
                f"++policy_base_url={up}/v1",
                f"++policy_api_key={KEY}",
                "++observability_enabled=true",
                f"++model_call_capture_dir={capture_dir}",
            ]
            with _process(on) as rollcap:
                targets = {
                    "direct, http stream": up,
                    "direct, websocket": up,
                    "rollcap, http stream": rollcap + "/ng-rollout/0-0",
                    "rollcap, websocket": rollcap + "/ng-rollout/1-0",
                }
                results = {
                    name: asyncio.run(_measure(name, base, args)) for name, base in targets.items()
                }
        turns = args.tool_turns + 1
        print(
            f"{turns} turns a conversation ({args.tool_turns} tool calls), {args.conversations} "
            f"sequential conversations, {args.concurrent} at once; rollcap with capture on"
        )
        print(f"{'':24}{'turn p50 ms':>12}{'turn p99 ms':>12}{'conv p50 ms':>12}{'turns/s':>10}")
        for name, r in results.items():
            print(
                f"{name:24}{r['turn_p50']:12.2f}{r['turn_p99']:12.2f}"
                f"{r['conversation_p50']:12.1f}{r['turns_per_s']:10.0f}"
            )
        for where in ("direct", "rollcap"):
            socket, http = results[f"{where}, websocket"], results[f"{where}, http stream"]
            print(
                f"{where}: websocket conversation / http stream: "
                f"{socket['conversation_p50'] / http['conversation_p50']:.2f}, "
                f"turns/s {socket['turns_per_s'] / http['turns_per_s']:.2f}"
            )
        written = {p.name: sum(1 for _ in p.open("rb")) for p in sorted(capture_dir.iterdir())}
        print(f"capture on wrote {written}")
    finally:
        shutil.rmtree(capture_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
