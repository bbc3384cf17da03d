"""Claude Code and Codex CLI, unmodified, through rollcap: every call's record is exactly the call.

Each harness runs non-interactively (``claude -p``, ``codex exec``) against ``rollcap serve
model`` and the scripted upstream (``_upstream.py``), which has it run a shell command and read a
file, then answers. The upstream keeps what it received and sent; each call must have one record
whose request is the body the upstream received, whose raw stream is the bytes it sent, whose
response is what the official SDK makes of those bytes, with time to first token, tool calls and
tokens as sent; rollcap counts no uncorrelated call, and neither key is in the capture or the log.

Codex runs twice: through a provider of its own over HTTP (``codex``), and through its built-in
OpenAI provider (``codex-ws``), which talks Responses over a WebSocket: there each turn (each
``response.create``, its ``generate: false`` prewarm among them) must have its one record, with
``transport: "websocket"``, the event as the request and the server's messages, in SSE form, as
the raw stream; and no call may have fallen back to HTTP. Each run's wall time is printed at the
end of the session and written to its ``result.json``, never asserted on.

Where ``unshare`` works, the whole run is in a network namespace whose only interface is
loopback, and the test checks that: no byte can leave the machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap import CaptureStore, ModelCallRecord, read_model_call_records
from tests.dialects._sdk import sdk_final, without_filled_nulls
from tests.harness._stack import CLIENT_KEY, ROLLOUT_ID, UPSTREAM_KEY, claude_steps, codex_steps
from tests.harness._upstream import FIRST_BYTE_DELAY_S, MARK, Exchange
from tests.harness.conftest import REPO, WALL_TIMES, Harness, netns_prefix

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 330  # the harness's own limit (240 s) plus starting and stopping the servers
# The calls rollcap captures; count_tokens and /v1/models pass through uncaptured, by design.
# A prewarm (``generate: false`` on a socket) is a turn like any other.
CAPTURED_KINDS = {"tool", "answer", "side", "prewarm"}
SESSION_HEADERS = {
    "claude": "x-claude-code-session-id",
    "codex": "session-id",
    "codex-ws": "session-id",
}


def _completed_response(raw: bytes) -> dict[str, Any]:
    """The ``response.completed`` event's response: the whole answer, as the server sent it."""
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: "):
                event = orjson.loads(line[len(b"data: ") :])
                if event.get("type") == "response.completed":
                    response: dict[str, Any] = event["response"]
                    return response
    raise AssertionError("no response.completed event in the stream")


def _expected_tokens(dialect: str, usage: dict[str, Any]) -> dict[str, int | None]:
    """The contract's normalization of what the upstream reported, worked out by hand."""
    if dialect == "messages":
        cache_read = usage["cache_read_input_tokens"]
        cache_creation = usage["cache_creation_input_tokens"]
        tokens_in = usage["input_tokens"] + cache_read + cache_creation
        return {
            "tokens_in": tokens_in,
            "tokens_out": usage["output_tokens"],
            "tokens_reasoning": None,
            "tokens_total": tokens_in + usage["output_tokens"],
            "cached_tokens": cache_read,
            "cache_creation_tokens": cache_creation,
        }
    return {
        "tokens_in": usage["input_tokens"],
        "tokens_out": usage["output_tokens"],
        "tokens_reasoning": usage["output_tokens_details"]["reasoning_tokens"],
        "tokens_total": usage["total_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "cache_creation_tokens": None,
    }


def _tokens(call: ModelCallRecord) -> dict[str, int | None]:
    return {
        "tokens_in": call.tokens_in,
        "tokens_out": call.tokens_out,
        "tokens_reasoning": call.tokens_reasoning,
        "tokens_total": call.tokens_total,
        "cached_tokens": call.cached_tokens,
        "cache_creation_tokens": call.cache_creation_tokens,
    }


def _run(harness: Harness, out: Path) -> dict[str, Any]:
    prefix = netns_prefix()
    command = [*prefix, sys.executable, "-m", "tests.harness._stack", harness.name]
    command += [str(harness.bin), str(out), *(["--netns"] if prefix else [])]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = orjson.loads((out / "result.json").read_bytes())
    harness_output = (out / "harness.stdout").read_text() + (out / "harness.stderr").read_text()
    assert result["harness_rc"] == 0, harness_output[-4000:]
    return result


def test_every_call_has_its_exact_record(
    harness: Harness, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    out = tmp_path / harness.name
    out.mkdir()
    result = _run(harness, out)
    if result["netns"]:
        assert result["interfaces"] == ["lo"]
        assert result["outside"] == "unreachable"
    assert result["server_rc"] == 0
    # Every call reached the upstream with rollcap's key in place of the harness's.
    assert result["refused_credentials"] == 0

    exchanges = [Exchange.from_json(e) for e in orjson.loads((out / "exchanges.json").read_bytes())]
    calls = [e for e in exchanges if e.kind in CAPTURED_KINDS]
    # Measured, for the summary; nothing is asserted about time.
    wall = (result["harness_wall_s"], len(calls))
    request.config.stash.setdefault(WALL_TIMES, {})[harness.name] = wall
    print(f"{harness.name}: harness wall time {wall[0]:.3f} s, {wall[1]} model calls")
    dialect = "messages" if harness.name == "claude" else "responses"
    websocket = harness.name == "codex-ws"
    # Each call reached the upstream at the path and query the harness sent (the Anthropic
    # SDK's beta client adds ``?beta=true``); a socket's turns at its handshake's.
    sent = f"/v1/{dialect}?beta=true" if harness.name == "claude" else f"/v1/{dialect}"
    assert {e.path for e in calls} == {sent}
    sockets = [e for e in exchanges if e.kind == "websocket"]
    if websocket:
        # One socket, every call a message on it: no call fell back to HTTP (Codex does, at
        # once, when the socket fails), not even a refused handshake.
        over_http = [
            (e.method, e.path, e.status)
            for e in exchanges
            if e.transport == "http" and e.kind != "websocket"
        ]
        assert over_http == [], f"calls over HTTP, not the WebSocket: {over_http}"
        assert [(e.method, e.status) for e in sockets] == [("GET", 101)]
        assert {e.socket for e in exchanges if e.transport == "websocket"} == {sockets[0].index}
        # Codex sends no event but response.create; another would show here by its type.
        assert {e.kind for e in exchanges} <= CAPTURED_KINDS | {"websocket"}
    else:
        assert sockets == []
        assert {e.transport for e in exchanges} == {"http"}

    # The script ran: each step's tool call, its output in the agent's next request, then the
    # answer. Side calls (a title, a summary) may come in between.
    steps = claude_steps(out / "work") if harness.name == "claude" else codex_steps(out / "work")
    turns = [e for e in calls if e.kind in ("tool", "answer")]
    assert [e.kind for e in turns] == ["tool"] * len(steps) + ["answer"]
    for turn, following, step in zip(turns, turns[1:], steps, strict=False):
        (tool,) = turn.tool_calls
        assert (tool["name"], tool["arguments"]) == (step.name, step.arguments)
        assert step.expect_in_result in following.tool_results[tool["call_id"]]
    # The header each sends as its session id (README), on every call, through rollcap.
    sessions = {e.headers.get(SESSION_HEADERS[harness.name]) for e in calls}
    assert len(sessions) == 1
    assert None not in sessions

    health = orjson.loads((out / "health.json").read_bytes())
    assert health["uncorrelated"] == 0
    assert health["capture_failures"] == 0
    assert health["captured"] == len(calls)

    capture = out / "model-calls"
    lines = (capture / f"{ROLLOUT_ID}.capture.jsonl").read_bytes().splitlines()
    records = [orjson.loads(line) for line in lines]
    normalized = read_model_call_records(CaptureStore(capture), ROLLOUT_ID)
    assert len(records) == len(normalized) == len(calls)  # one record per call, no other
    by_id = {
        record["response"]["id"]: (record, call)
        for record, call in zip(records, normalized, strict=True)
    }
    assert sorted(by_id) == sorted(e.response_id for e in calls if e.response_id)

    for exchange in calls:
        record, call = by_id[exchange.response_id]
        assert record["dialect"] == dialect
        assert record["status_code"] == 200
        assert record["error_category"] is None
        assert "gaps" not in record
        if websocket:
            assert exchange.transport == "websocket"
            assert record["transport"] == "websocket"
            # The turn's request is the event as the upstream received it, less its type.
            event = orjson.loads(exchange.request)
            assert event.pop("type") == "response.create"
            assert record["request"] == event
        else:
            assert "transport" not in record
            assert record["request"] == orjson.loads(exchange.request)
        if exchange.stream:
            assert record["response_raw"] == exchange.response.decode()
            reference = (
                without_filled_nulls(sdk_final("messages", exchange.response), exchange.response)
                if dialect == "messages"
                else _completed_response(exchange.response)
            )
            assert record["response"] == reference
            # The upstream held its first byte back this long; the record's TTFT includes it.
            ttft = record["latency_ttft_ms"]
            assert FIRST_BYTE_DELAY_S * 1000 <= ttft <= record["latency_ms"]
        else:
            assert record["response"] == orjson.loads(exchange.response)
        assert call.tool_calls == exchange.tool_calls
        assert _tokens(call) == _expected_tokens(dialect, exchange.usage)
        assert call.response_id == exchange.response_id
        assert call.client_session_id == exchange.headers[SESSION_HEADERS[harness.name]]
        assert MARK in (call.response_id or "")

    # Neither key anywhere in the capture or in rollcap's log.
    written = [path for path in capture.rglob("*") if path.is_file()] + [out / "rollcap.log"]
    for path in written:
        content = path.read_bytes()
        for key in (CLIENT_KEY, UPSTREAM_KEY):
            assert key.encode() not in content, f"a key was written to {path.name}"
