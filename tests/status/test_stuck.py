"""The live states end to end: a real collection of an agent on a real socket, whose rollouts
call a capturing model server in front of the fake upstream, and get stuck as runs do.

- ``stall``: the upstream sends the stream's first event, then nothing: its call is
  ``stalled`` on the model server's ``/inflight`` and in the collection's status; when the
  agent gives up on it, the call is ``cancelled``, then gone.
- ``tool``: one model call, then the agent sits in a "tool" until the test lets it go: the
  rollout is ``stalled`` between calls.
- ``slow``: short streamed calls one after another, far longer in all than the ``quick``
  rollouts that finished first: the rollout is ``slow``.

The thresholds are a second or so, so that each state comes in a few seconds; what is checked
is what the model server and the status say, and the silence or idle time at which they first
said it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.collect import CollectionSummary, collect
from rollcap.ids import rollout_id_from_run
from rollcap.status import LiveStatusSettings, StatusOptions, StatusSource, status_path
from rollcap.testing import FakeUpstream
from tests._polling import until
from tests.collect.conftest import write_input
from tests.server.conftest import client_headers, model_server, request_body, settings_for

# How long a test waits for a state to come: a bound on a hang, not a figure.
BOUND_S = 20.0

LIVE = LiveStatusSettings(
    interval_s=0.2,
    stalled_upstream_s=1.0,
    stalled_between_calls_s=1.5,
    slow_factor=2.0,
    slow_min_finished=3,
    cancelled_linger_s=1.0,
)
TASKS = [{"kind": "quick"}] * 3 + [{"kind": "stall"}, {"kind": "tool"}, {"kind": "slow"}]
# The rollout ids collection gives them: task index, rollout index, attempt 0.
STALL, TOOL, SLOW = "3-0", "4-0", "5-0"


@dataclass
class Agent:
    """The agent's side: what it has done, and the events that let it go on."""

    model_url: str
    session: aiohttp.ClientSession
    stalled_stream_began: asyncio.Event = field(default_factory=asyncio.Event)
    give_up: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, rollout_id: str, *, stream: bool, **knobs: str) -> aiohttp.ClientResponse:
        return await self.session.post(
            f"{self.model_url}/ng-rollout/{rollout_id}/v1/chat/completions",
            json=request_body("chat", stream=stream),
            headers=client_headers("chat", **knobs),
        )

    async def run(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        rollout_id = rollout_id_from_run(body)
        assert rollout_id is not None
        kind = body["kind"]
        if kind == "stall":
            # One event, then a minute of silence: the agent gives up when the test says.
            response = await self.call(
                rollout_id, stream=True, **{"x-fake-events": "5", "x-fake-chunk-delay-ms": "60000"}
            )
            await response.content.readany()
            self.stalled_stream_began.set()
            await self.give_up.wait()
            response.close()
            await self.release.wait()
        elif kind == "tool":
            async with await self.call(rollout_id, stream=False) as response:
                await response.read()
            await self.release.wait()  # the tool that never returns
        elif kind == "slow":
            while not self.release.is_set():
                knobs = {"x-fake-events": "4", "x-fake-chunk-delay-ms": "50"}
                async with await self.call(rollout_id, stream=True, **knobs) as response:
                    await response.read()
        else:
            async with await self.call(rollout_id, stream=False) as response:
                await response.read()
        answer = {"response": {"output_text": kind}, "reward": 1.0}
        return Response(orjson.dumps(answer), media_type="application/json")


@dataclass
class StuckRun:
    agent: Agent
    model_url: str
    status_file: Path
    collection: asyncio.Task[CollectionSummary]

    async def inflight(self) -> dict[str, Any]:
        async with self.agent.session.get(self.model_url + "/inflight") as response:
            assert response.status == 200
            answer: dict[str, Any] = orjson.loads(await response.read())
            return answer

    def exists(self) -> dict[str, Any]:
        return {"exists": True} if self.status_file.exists() else {}

    def status(self) -> dict[str, Any]:
        """The collection's status as ``rollcap status`` reads it (its one run)."""
        (document,) = StatusSource(path=self.status_file).fetch()
        return document


@contextlib.asynccontextmanager
async def stuck_run(tmp_path: Path) -> AsyncIterator[StuckRun]:
    capture_dir = tmp_path / "model-calls"
    settings = replace(settings_for("", capture_dir), live_status=LIVE)
    async with (
        FakeUpstream(api_key="upstream-key") as upstream,
        model_server(
            replace(settings, base_url=upstream.url + "/v1", api_key="upstream-key")
        ) as model_url,
        aiohttp.ClientSession() as session,
    ):
        agent = Agent(model_url, session)
        app = Starlette(routes=[Route("/run", agent.run, methods=["POST"])])
        async with serving(app) as agent_url:
            output = tmp_path / "rollouts.jsonl"
            collection = asyncio.ensure_future(
                collect(
                    agent_url,
                    write_input(tmp_path / "tasks.jsonl", TASKS),
                    output,
                    capture_dir=capture_dir,
                    concurrency=len(TASKS),
                    status=StatusOptions(LIVE, servers=[("policy_model", model_url)]),
                )
            )
            try:
                run = StuckRun(agent, model_url, status_path(output), collection)
                # The status file is there once the run has counted its tasks.
                await _until(_async(run.exists), bool)
                yield run
            finally:
                agent.give_up.set()
                agent.release.set()
                summary = await asyncio.wait_for(collection, BOUND_S)
                assert (summary.ran, summary.failed) == (len(TASKS), 0), (
                    summary.failures_path.read_text()[:3000]
                )


async def _until(
    check: Callable[[], Awaitable[dict[str, Any]]], done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    return await until(check, done, bound_s=BOUND_S, every_s=0.02)


def _rollout(document: dict[str, Any], rollout_id: str) -> dict[str, Any] | None:
    return next((r for r in document["rollouts"] if r["rollout_id"] == rollout_id), None)


def _in_state(rollout_id: str, state: str) -> Callable[[dict[str, Any]], bool]:
    def check(document: dict[str, Any]) -> bool:
        rollout = _rollout(document, rollout_id)
        return rollout is not None and rollout["state"] == state

    return check


def _stall_call(answer: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in answer["calls"] if c["rollout_id"] == STALL), None)


async def test_a_stalled_stream_is_stalled_then_cancelled_then_gone(tmp_path: Path) -> None:
    async with stuck_run(tmp_path) as run:
        await asyncio.wait_for(run.agent.stalled_stream_began.wait(), BOUND_S)
        limit_s = LIVE.stalled_upstream_s + 1.0

        # The model server: the call with its rollout, stalled once upstream was silent long
        # enough, and said so well within the configured time plus a second.
        def stalled(answer: dict[str, Any]) -> bool:
            call = _stall_call(answer)
            return call is not None and call["state"] == "stalled"

        seen = await _until(run.inflight, stalled)
        call = _stall_call(seen)
        assert call is not None
        assert (call["attempt"], call["dialect"], call["streamed"]) == (0, "chat", True)
        assert LIVE.stalled_upstream_s * 1000 <= call["upstream_silence_ms"] < limit_s * 1000
        assert call["upstream_bytes"] > 0  # it stopped mid-stream, not before

        # The collection's status: the rollout stalled on that call, first said at a silence
        # within the configured time plus a second.
        document = await _until(_async(run.status), _in_state(STALL, "stalled"))
        rollout = _rollout(document, STALL)
        assert rollout is not None
        doing = rollout["doing"]
        assert (doing["kind"], doing["server"], doing["state"]) == (
            "model_call",
            "policy_model",
            "stalled",
        )
        assert LIVE.stalled_upstream_s <= doing["upstream_silence_s"] < limit_s
        assert document["states"]["stalled"] >= 1
        assert document["rollouts"][0]["state"] == "stalled"  # the ones to look at come first

        # The agent gives up: the call is cancelled, then gone after cancelled_linger_s.
        run.agent.give_up.set()
        gone = await _until(run.inflight, lambda a: _stall_call(a) is None)
        (cancelled,) = [c for c in gone["cancelled"] if c["rollout_id"] == STALL]
        assert cancelled["state"] == "cancelled"
        document = await _until(_async(run.status), _in_state(STALL, "cancelled"))
        rollout = _rollout(document, STALL)
        assert rollout is not None
        assert rollout["last_call"] == "cancelled"
        await _until(
            run.inflight, lambda a: not [c for c in a["cancelled"] if c["rollout_id"] == STALL]
        )


async def test_an_agent_stuck_in_a_tool_is_stalled_and_a_long_rollout_is_slow(
    tmp_path: Path,
) -> None:
    async with stuck_run(tmp_path) as run:
        document = await _until(_async(run.status), _in_state(TOOL, "stalled"))
        rollout = _rollout(document, TOOL)
        assert rollout is not None
        assert rollout["calls"] == 1
        doing = rollout["doing"]
        assert doing["kind"] == "between_calls"
        limit_s = LIVE.stalled_between_calls_s + 1.0
        assert LIVE.stalled_between_calls_s <= doing["for_s"] < limit_s

        document = await _until(_async(run.status), _in_state(SLOW, "slow"))
        assert document["counts"]["done"] >= LIVE.slow_min_finished
        slow_after = document["slow_after_s"]
        rollout = _rollout(document, SLOW)
        assert rollout is not None
        assert rollout["elapsed_s"] > slow_after
        assert rollout["doing"]["kind"] in ("model_call", "between_calls")
        assert document["states"]["slow"] == 1


def _async(check: Callable[[], dict[str, Any]]) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def wrapped() -> dict[str, Any]:
        return await asyncio.to_thread(check)

    return wrapped


# -- rollcap status in a real terminal ---------------------------------------------------------


class Terminal:
    """A tmux session of its own (its own server socket), ``command`` running in its one pane."""

    def __init__(self, tmp_path: Path, command: list[str]) -> None:
        self.socket = str(tmp_path / "tmux.sock")
        self._tmux("new-session", "-d", "-s", "status", "-x", "160", "-y", "50", "sh")
        self._tmux("set-option", "-t", "status", "remain-on-exit", "on")
        # The test process may carry COLUMNS and LINES; a terminal's program reads its size from
        # the terminal, as in a person's shell, where they are not exported.
        sized = ["env", "-u", "COLUMNS", "-u", "LINES", *command]
        # Its exit status is written down by the shell: tmux's own pane_dead_status can stay
        # empty when the terminal closes before the process is reaped.
        self._status = tmp_path / "exit-status"
        line = f"{shlex.join(sized)}; echo $? > {shlex.quote(str(self._status))}"
        self._tmux("respawn-pane", "-k", "-t", "status", line)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return done.stdout

    def screen(self, *, history: bool = False) -> str:
        """What the pane shows (``history``: with the lines scrolled off above it)."""
        start = ("-S", "-") if history else ()
        return self._tmux("capture-pane", "-p", *start, "-t", "status")

    def exit_status(self) -> int | None:
        """The command's exit status once it has exited, else ``None``."""
        text = self._status.read_text() if self._status.exists() else ""
        return int(text) if text.endswith("\n") else None

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], check=False, timeout=30)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux: make tmux installs it")
async def test_rollcap_status_in_a_terminal_shows_the_stuck_ones_and_exits_at_the_end(
    tmp_path: Path,
) -> None:
    async with stuck_run(tmp_path) as run:
        rollcap = str(Path(sys.executable).parent / "rollcap")
        command = [rollcap, "status", "--status-file", str(run.status_file), "--interval", "0.2"]
        terminal = Terminal(tmp_path, command)
        try:

            async def screen() -> dict[str, Any]:
                return {"text": await asyncio.to_thread(terminal.screen)}

            def shows_all(answer: dict[str, Any]) -> bool:
                rows = {line.split()[0]: line for line in answer["text"].splitlines() if line}
                return (
                    "stalled" in rows.get(STALL, "")
                    and "stalled" in rows.get(TOOL, "")
                    and "slow" in rows.get(SLOW, "")
                )

            seen = (await _until(screen, shows_all))["text"]
            rows = {line.split()[0]: line for line in seen.splitlines() if line}
            assert "model call on policy_model: streaming" in rows[STALL]
            assert "(stalled)" in rows[STALL]
            assert "between calls (agent or tool)" in rows[TOOL]
            # Stalled ones are listed first, then the slow one.
            order = [line.split()[0] for line in seen.splitlines() if line.split()[:1]]
            assert order.index(STALL) < order.index(SLOW)
            assert order.index(TOOL) < order.index(SLOW)
            assert "2 stalled, 1 slow" in seen
            assert terminal.exit_status() is None  # it watches until the run ends

            run.agent.give_up.set()
            run.agent.release.set()
            await asyncio.wait_for(run.collection, BOUND_S)

            async def exited() -> dict[str, Any]:
                return {"status": await asyncio.to_thread(terminal.exit_status)}

            done = await _until(exited, lambda answer: answer["status"] is not None)
            assert done["status"] == 0
            final = terminal.screen(history=True)
            assert "FINISHED" in final
            assert f"{len(TASKS)}/{len(TASKS)} done, 0 failed" in final
        finally:
            terminal.close()
