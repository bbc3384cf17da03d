"""Capture size: a multi-turn tool run's capture files compacted, beside ``zstd -19``, in one run.

    .venv/bin/python bench/compress.py [--rollouts N] [--turns T]

The fake upstream (``python -m rollcap.testing``, scenario ``tool_turns``) and a model server
with capture on (``rollcap serve model``) run in processes of their own. Each rollout here is
an agent loop over the official ``openai`` client: the whole conversation is sent again on
every call, and each tool call is answered with a source file of this repository (what a coding
agent reads back), so a rollout of T tool turns makes T + 1 calls and its capture grows with the
square of the turns, as a real agent's does.

Reported, for the same files: their plain size; ``rollcap capture compress`` at the default
level and at 19 (size, ratio, seconds); and ``zstd -19`` of each plain file (the floor: the
same codec at its usual strongest setting, by its own tool).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from _procs import server_url, started
from rollcap.routing import ROLLOUT_PREFIX
from rollcap.store import DEFAULT_LEVEL, compress_directory

BIN = Path(sys.executable).parent
KEY = "bench-key"
SOURCES = sorted((Path(__file__).resolve().parents[1] / "src" / "rollcap").rglob("*.py"))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


@contextlib.contextmanager
def _process(args: list[str]) -> Iterator[str]:
    with started(args) as (_, lines):
        yield server_url(lines[0])


def _rollout(base_url: str, rollout_id: str, turns: int, offset: int) -> int:
    """One agent loop; the number of model calls it made."""
    client = openai.OpenAI(
        base_url=f"{base_url}{ROLLOUT_PREFIX}{rollout_id}/v1",
        api_key=KEY,
        http_client=httpx.Client(),
        default_headers={"x-fake-scenario": "tool_turns", "x-fake-tool-turns": str(turns)},
    )
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent. Read what you need, then answer."},
        {"role": "user", "content": "Find where capture files are compacted and explain it."},
    ]
    calls = 0
    with client:
        while True:
            answer = client.chat.completions.create(
                model="fake-model",
                messages=messages,
                tools=TOOLS,
            )
            calls += 1
            message = answer.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return calls
            for call in message.tool_calls:
                source = SOURCES[(offset + len(messages)) % len(SOURCES)]
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": source.read_text()}
                )


def _size(directory: Path, pattern: str) -> int:
    return sum(path.stat().st_size for path in directory.glob(pattern))


def _compacted(plain: Path, work: Path, level: int) -> tuple[int, float]:
    copy = work / f"level-{level}"
    shutil.copytree(plain, copy)
    start = time.perf_counter()
    done = compress_directory(copy, level=level)
    elapsed = time.perf_counter() - start
    assert not done.failed, done.failed
    return _size(copy, "*.zst"), elapsed


def _zstd_19(plain: Path, work: Path) -> tuple[int, float]:
    out = work / "zstd-19"
    out.mkdir()
    start = time.perf_counter()
    for path in sorted(plain.glob("*.capture.jsonl")):
        target = out / (path.name + ".zst")
        subprocess.run(["zstd", "-q", "-19", "-o", str(target), str(path)], check=True)
    return _size(out, "*.zst"), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=12)
    parser.add_argument("--turns", type=int, default=24, help="tool turns a rollout")
    args = parser.parse_args()
    if shutil.which("zstd") is None:
        sys.exit("bench/compress.py needs the zstd tool (make zstd)")
    work = Path(tempfile.mkdtemp(prefix="rollcap-bench-compress-"))
    capture = work / "plain"
    serve = [str(BIN / "rollcap"), "serve", "model", "--model-type", "openai_model", "--port", "0"]
    try:
        up_args = [sys.executable, "-m", "rollcap.testing", "--port", "0", "--api-key", KEY]
        with _process(up_args) as upstream:
            common = [f"++policy_base_url={upstream}/v1", f"++policy_api_key={KEY}"]
            on = ["++observability_enabled=true", f"++model_call_capture_dir={capture}"]
            with _process([*serve, *common, *on]) as model:
                calls = sum(
                    _rollout(model, f"{n}-0", args.turns, n * 7) for n in range(args.rollouts)
                )
        plain = _size(capture, "*.capture.jsonl")
        print(f"{args.rollouts} rollouts, {calls} calls ({calls // args.rollouts} a rollout): "
              f"{plain / 1e6:.2f} MB plain, {plain / calls / 1e3:.0f} KB a call")  # fmt: skip
        default = f"capture compress (level {DEFAULT_LEVEL})"
        rows = [
            (default, *_compacted(capture, work, DEFAULT_LEVEL)),
            ("capture compress --level 19", *_compacted(capture, work, 19)),
            ("zstd -19, each file (floor)", *_zstd_19(capture, work)),
        ]
        for label, size, seconds in rows:
            print(f"  {label:<32} {size / 1e6:8.3f} MB  {plain / size:6.1f}x smaller "
                  f"({100 * (1 - size / plain):.2f}%)  {seconds:6.2f} s")  # fmt: skip
        floor = rows[-1][1]
        for label, size, _ in rows[:-1]:
            print(f"{label} / zstd -19: {size / floor:.2f}x the floor's size")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
