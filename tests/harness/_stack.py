"""One real harness run against rollcap and the scripted upstream, everything on 127.0.0.1.

    python -m tests.harness._stack {claude,codex,codex-ws} HARNESS_BIN OUT_DIR [--netns]

It starts the scripted upstream (in this process), ``rollcap serve model`` in front of it (a
subprocess, as a user starts it, its log kept), then the harness, unmodified and non-interactive,
pointed at rollcap through the rollout prefix, with a fake key: ``codex`` through a provider of
its own, over HTTP, ``codex-ws`` through its built-in OpenAI provider, which talks Responses over
a WebSocket. When the harness is done it writes what crossed the wire to OUT_DIR:
``exchanges.json`` (the upstream's view of every call), ``health.json`` (rollcap's counters),
``rollcap.log``, the harness's stdout and stderr, and ``result.json`` (with the harness's wall
time). The test (``test_harnesses.py``) holds the capture to them.

The test runs this in a network namespace of its own (``unshare --net``) with ``--netns``: it
brings loopback up there, the namespace's only interface, so nothing the harness (or anything
else here) sends can leave the machine, whatever its settings say.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.harness._upstream import ScriptedUpstream, Step, scripted_upstream

__all__ = [
    "CLIENT_KEY",
    "HARNESSES",
    "ROLLOUT_ID",
    "UPSTREAM_KEY",
    "claude_steps",
    "codex_steps",
]

HARNESSES = ("claude", "codex", "codex-ws")

# The harness's key and the upstream's: rollcap must send the second in place of the first and
# write neither anywhere.
CLIENT_KEY = "sk-harness-client-7f3c1e9a-not-real"
UPSTREAM_KEY = "sk-harness-upstream-2b8d4f60-not-real"
ROLLOUT_ID = "harness-0"
NOTES_TEXT = "rollcap-harness-ok"
PROMPT = "Run `echo hi` in the shell, then read notes.txt, then tell me what both said."
HARNESS_TIMEOUT_S = 240.0
SERVER_START_S = 60.0
# TEST-NET-1 (RFC 5737): never routed anywhere; in the namespace a connect must fail at once.
_OUTSIDE = ("192.0.2.1", 443)


def claude_steps(work: Path) -> list[Step]:
    return [
        Step("Bash", {"command": "echo hi", "description": "Print hi"}, "hi"),
        Step("Read", {"file_path": str(work / "notes.txt")}, NOTES_TEXT),
    ]


def codex_steps(work: Path) -> list[Step]:
    return [
        Step("exec_command", {"cmd": "echo hi", "workdir": str(work)}, "hi"),
        Step("exec_command", {"cmd": "cat notes.txt", "workdir": str(work)}, NOTES_TEXT),
    ]


def _loopback_up() -> None:
    """``ip link set lo up`` without needing ``ip``: a new namespace's loopback starts down."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


def _outside_reachable() -> str:
    """What a connection to an address off this machine gets: ``unreachable`` in the namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(_OUTSIDE)
        except OSError as exc:
            return "unreachable" if exc.errno == errno.ENETUNREACH else f"error {exc.errno}"
    return "connected"


def _claude(bin_path: str, url: str) -> tuple[list[str], dict[str, str]]:
    env = {
        "ANTHROPIC_BASE_URL": f"{url}/ng-rollout/{ROLLOUT_ID}",
        "ANTHROPIC_API_KEY": CLIENT_KEY,
        # No telemetry, error reports, update checks or other side traffic.
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
    }
    # Only the script's two tools run without asking: -p cannot ask.
    args = [bin_path, "-p", PROMPT, "--output-format", "json"]
    args += ["--allowedTools", "Bash(echo hi)", "Read"]
    return args, env


def _codex(
    bin_path: str, url: str, home: Path, work: Path, *, websocket: bool
) -> tuple[list[str], dict[str, str]]:
    codex_home = home / ".codex"
    codex_home.mkdir()
    base_url = f"{url}/ng-rollout/{ROLLOUT_ID}/v1"
    # Over HTTP, a provider of its own: the built-in OpenAI one talks Responses over a WebSocket
    # (and falls back to HTTP when that fails). Over the WebSocket, that built-in provider,
    # pointed at rollcap by ``openai_base_url``: it cannot be redefined under
    # ``[model_providers]``, and this version ignores OPENAI_BASE_URL. WebSocket mode is its
    # default (its ``responses_websockets`` flags are removed ones), its key OPENAI_API_KEY.
    provider = (
        f'openai_base_url = "{base_url}"\n'
        if websocket
        else f"""\
model_provider = "rollcap"

[model_providers.rollcap]
name = "rollcap"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    # --strict-config refuses a key this version does not know, so the telemetry switches below
    # are real ones. The model is one Codex knows whose shell tool is a plain function
    # (exec_command): its default model reaches the shell only through JavaScript in a code-mode
    # `exec` tool. Its sandbox is off: it needs namespaces the test's own may not allow, and the
    # namespace is the sandbox here.
    (codex_home / "config.toml").write_text(
        f"""\
model = "gpt-5.5"
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "danger-full-access"
{provider}
[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"
"""
    )
    env = {"CODEX_HOME": str(codex_home), "OPENAI_API_KEY": CLIENT_KEY}
    args = [bin_path, "exec", "--strict-config", "--skip-git-repo-check", "-C", str(work)]
    return [*args, PROMPT], env


def _node_dir() -> str:
    """Codex's launcher is a Node script: the harness needs node, and nothing else of PATH."""
    node = shutil.which("node")
    return str(Path(node).parent) if node else "/usr/bin"


async def _start_rollcap(
    model_type: str, upstream: ScriptedUpstream, capture: Path, where: Path, log: Path
) -> tuple[asyncio.subprocess.Process, str]:
    where.mkdir()
    # The upstream's key goes where a user puts it, env.yaml, never on the command line.
    (where / "env.yaml").write_text(f"policy_api_key: {UPSTREAM_KEY}\n")
    rollcap = str(Path(sys.executable).parent / "rollcap")
    args = [rollcap, "serve", "model", "--model-type", model_type, "--port", "0"]
    args += [f"++policy_base_url={upstream.url}", "++observability_enabled=true"]
    args += [f"++model_call_capture_dir={capture}"]
    # Each harness's own session header, so that its calls are correlated as one session.
    args += ["++client_session_headers=[x-session-id, session-id, x-claude-code-session-id]"]
    with log.open("wb") as out:
        server = await asyncio.create_subprocess_exec(
            *args, cwd=where, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SERVER_START_S
    while loop.time() < deadline:
        found = re.search(rb" on (http://127\.0\.0\.1:\d+)", log.read_bytes())
        if found:
            return server, found.group(1).decode()
        if server.returncode is not None:
            break
        await asyncio.sleep(0.1)
    raise RuntimeError(f"rollcap serve model did not start: {log.read_text()[-2000:]}")


async def _stop(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)  # as Ctrl-C: the server stops cleanly
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode if process.returncode is not None else -1


async def run(harness: str, bin_path: str, out: Path, *, netns: bool) -> dict[str, Any]:
    if netns:
        _loopback_up()
    home, work, capture = out / "home", out / "work", out / "model-calls"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text(NOTES_TEXT + "\n")
    steps = claude_steps(work) if harness == "claude" else codex_steps(work)
    messages_steps, responses_steps = (steps, []) if harness == "claude" else ([], steps)
    async with scripted_upstream(messages_steps, responses_steps, UPSTREAM_KEY) as upstream:
        model_type = "anthropic_model" if harness == "claude" else "openai_model"
        server, url = await _start_rollcap(
            model_type, upstream, capture, out / "rollcap", out / "rollcap.log"
        )
        try:
            if harness == "claude":
                args, extra = _claude(bin_path, url)
            else:
                args, extra = _codex(bin_path, url, home, work, websocket=harness == "codex-ws")
            # Nothing of this process's environment (a real key, a proxy) reaches the harness.
            env = {
                "PATH": os.pathsep.join(dict.fromkeys([_node_dir(), "/usr/bin", "/bin"])),
                "HOME": str(home),
                "LANG": "C.UTF-8",
                "TERM": "dumb",
                "NO_COLOR": "1",
                **extra,
            }
            with (
                (out / "harness.stdout").open("wb") as stdout,
                (out / "harness.stderr").open("wb") as stderr,
            ):
                started = time.monotonic()
                process = await asyncio.create_subprocess_exec(
                    *args,
                    cwd=work,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,  # its tools' processes too, for the kill below
                )
                try:
                    harness_rc = await asyncio.wait_for(process.wait(), HARNESS_TIMEOUT_S)
                except TimeoutError:
                    os.killpg(process.pid, signal.SIGKILL)
                    harness_rc = await process.wait()
                harness_wall_s = time.monotonic() - started
            async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as got:
                health = await got.json()
        finally:
            server_rc = await _stop(server)
        exchanges = [exchange.to_json() for exchange in upstream.exchanges]
        refused = upstream.refused_credentials
    result = {
        "harness": harness,
        "harness_rc": harness_rc,
        # From the harness's start to its exit: the whole session, every call in it.
        "harness_wall_s": round(harness_wall_s, 3),
        "server_rc": server_rc,
        "netns": netns,
        "interfaces": [name for _, name in socket.if_nameindex()],
        "outside": _outside_reachable() if netns else None,
        "refused_credentials": refused,
    }
    (out / "exchanges.json").write_bytes(orjson.dumps(exchanges))
    (out / "health.json").write_bytes(orjson.dumps(health))
    (out / "result.json").write_bytes(orjson.dumps(result))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness._stack")
    parser.add_argument("harness", choices=HARNESSES)
    parser.add_argument("bin", type=os.path.abspath)
    parser.add_argument("out", type=Path)
    parser.add_argument("--netns", action="store_true", help="in a fresh network namespace")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args.harness, args.bin, args.out, netns=args.netns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
