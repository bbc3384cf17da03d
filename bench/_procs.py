"""Starting and stopping the server processes a benchmark measures."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


def stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def started(
    args: list[str], ready: str = "", env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Start a server and read its stdout up to the first line starting with ``ready``."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(ready):
                break
        yield proc, lines
    finally:
        stop(proc)


def server_url(line: str) -> str:
    """The URL in a server's first line: ``... on <url> ...`` (a model server), or the whole line
    (the fake upstream prints its URL alone)."""
    return line.split(" on ", 1)[1].split(" ", 1)[0] if " on " in line else line.strip()


def free_port() -> int:
    """A port nothing listens on now, for a command that must be told one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def agent_url(lines: list[str]) -> str:
    """The agent's URL among the server lines ``rollcap env start`` printed."""
    for line in lines:
        if line.startswith("responses_api_agents"):
            return line.split()[-1]
    raise RuntimeError("env start printed no agent")


_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Cpu:
    """User + system CPU seconds of a process: its main thread, and all its threads together
    (threads that have ended included)."""

    main: float
    total: float

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.main - other.main, self.total - other.total)

    @property
    def threads(self) -> float:
        """What every thread but the main one spent (the two readings are a tick apart at
        most: never below zero)."""
        return max(0.0, self.total - self.main)


def _stat_seconds(path: str) -> float:
    with open(path) as stat:
        # The command name (field 2) may hold spaces: the fields after it follow its ")".
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def cpu_of(pid: int) -> Cpu:
    """The process's CPU so far, from ``/proc`` (Linux), at the kernel's tick (10 ms)."""
    return Cpu(_stat_seconds(f"/proc/{pid}/task/{pid}/stat"), _stat_seconds(f"/proc/{pid}/stat"))
