"""The real harnesses, as ``make harness`` installs them, and a network namespace to run them in.

The versions are pinned in ``tests/harness/package.json``; ``make harness`` (which ``make unit``
and ``make test`` run) installs them into ``.harness/`` from the npm registry. Where node or npm
is missing, or the pinned version is not installed, the harness's tests skip with the reason.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLED = REPO / ".harness" / "node_modules"
PINNED: dict[str, str] = orjson.loads((Path(__file__).parent / "package.json").read_bytes())[
    "dependencies"
]
# Harness -> (npm package, its command). ``codex-ws`` is Codex CLI again, with its built-in
# OpenAI provider: Responses over a WebSocket (``codex`` has a provider of its own, over HTTP).
PACKAGES = {
    "claude": ("@anthropic-ai/claude-code", "claude"),
    "codex": ("@openai/codex", "codex"),
    "codex-ws": ("@openai/codex", "codex"),
}
# Each harness run's wall time (seconds) and its model calls, printed at the end of the session:
# measured, never asserted on.
WALL_TIMES = pytest.StashKey[dict[str, tuple[float, int]]]()


@dataclass(frozen=True)
class Harness:
    name: str  # claude | codex | codex-ws
    package: str
    version: str
    bin: Path


@pytest.fixture(params=sorted(PACKAGES))
def harness(request: pytest.FixtureRequest) -> Harness:
    name: str = request.param
    package, command = PACKAGES[name]
    pinned = PINNED[package]
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip(f"{package}: node or npm is not installed")
    manifest = INSTALLED / package / "package.json"
    found = orjson.loads(manifest.read_bytes()).get("version") if manifest.is_file() else None
    if found != pinned:
        pytest.skip(f"{package}@{pinned} is not in .harness/ (found {found}): run `make harness`")
    return Harness(name, package, pinned, INSTALLED / ".bin" / command)


@functools.cache
def netns_prefix() -> tuple[str, ...]:
    """``unshare`` into a network namespace of its own (only loopback), where it works here.

    An empty prefix where it does not (no ``unshare``, user namespaces disabled): the harnesses
    then run in this machine's network, kept off it only by their own settings.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    prefix = (unshare, "--net", "--map-root-user")
    probe = [*prefix, sys.executable, "-c", "import socket; socket.if_nameindex()"]
    done = subprocess.run(probe, capture_output=True, check=False, timeout=30)
    return prefix if done.returncode == 0 else ()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    times = terminalreporter.config.stash.get(WALL_TIMES, {})
    if times:
        terminalreporter.section("harness wall times")
        for name, (seconds, calls) in sorted(times.items()):
            terminalreporter.write_line(f"{name}: {seconds:.3f} s, {calls} model calls")
