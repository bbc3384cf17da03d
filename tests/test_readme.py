"""The README's shell commands, run as written.

A fenced shell block is run when the line directly above its fence is a marker (an HTML
comment, so nothing shows when the README is rendered):

- ``<!-- readme-test: run -->``: the block runs as one ``bash -eu -o pipefail`` script and must
  exit 0;
- ``<!-- readme-test: serve -->``: every command but the last must end, and the last serves
  until Ctrl-C: it must print its ``http://127.0.0.1:<port>/`` URL, answer a GET of it, and exit
  0 on Ctrl-C (SIGINT).

The marked blocks run in README order, in one working directory, each seeing what the earlier
ones left there (``results/...``), against what the README's "Run an evaluation with capture"
section has the reader start first: an environment (``gym env start``) with capture on into
``results/model-calls``, here built by the test with the fake upstream in place of the OpenAI
API (so no credential and no network), serving both example benchmarks (``mcqa`` and
``calculator`` with their agents; ``policy_model_name`` ``gpt-4.1``). The shell finds it as a
reader's would, through the head server (``ROLLCAP_HEAD_URL``), and gets ``capture_dir`` as
that section sets it. ``rollcap``, ``gym`` and ``jq`` are found on ``PATH`` (``make test``
installs Debian's ``jq`` where it is missing). A filter that prints ``null`` fails the block
too: jq exits 0 on a key the line lacks, which is how a README goes stale unnoticed.

The test fails, never skips, when the README marks no block: a README that lost its markers
must not pass by running nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MODES = ("run", "serve")
SHELLS = frozenset({"bash", "sh", "shell"})
# Bounds a hung command, so that it fails this test instead of holding the suite.
BLOCK_BOUND_S = 300

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^<!--\s*readme-test\b(?P<rest>.*?)-->\s*$")
_MARKER_MODE = re.compile(r":\s*(?P<mode>[\w-]+)\s*$")
_URL = re.compile(r"http://127\.0\.0\.1:\d+/\S*")


class ReadmeMarkerError(ValueError):
    """A marker that marks no shell block, or names no mode this test knows."""


@dataclass(frozen=True, slots=True)
class Block:
    """One marked block: its mode, its text, and where it starts (1-based, the fence's line)."""

    mode: str
    script: str
    line: int

    @property
    def first_line(self) -> str:
        return self.script.splitlines()[0] if self.script else ""


def marked_blocks(text: str) -> list[Block]:
    """The marked shell blocks of a Markdown text, in order. ``ReadmeMarkerError`` for a marker
    not directly above a shell fence, or with an unknown mode: a typo must not silently turn
    a block's test off."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    pending: tuple[str, int] | None = None  # a marker's mode and line, awaiting its fence
    while index < len(lines):
        line = lines[index]
        marker = _MARKER.match(line.strip())
        fence = _FENCE.match(line)
        if pending is not None and fence is None:
            raise ReadmeMarkerError(
                f"README line {pending[1]}: a readme-test marker must be directly above a fence"
            )
        if marker is not None:
            mode = _MARKER_MODE.fullmatch(marker.group("rest").strip() or ":")
            if mode is None or mode.group("mode") not in MODES:
                raise ReadmeMarkerError(
                    f"README line {index + 1}: {line.strip()!r}: the mode must be one of "
                    f"{', '.join(MODES)} (<!-- readme-test: run -->)"
                )
            pending = (mode.group("mode"), index + 1)
            index += 1
            continue
        if fence is None:
            index += 1
            continue
        # A block: find its closing fence (the same character, at least as long).
        opening = fence.group("fence")
        end = index + 1
        while end < len(lines) and not (
            lines[end].startswith(opening[0] * len(opening))
            and not lines[end].strip(opening[0]).strip()
        ):
            end += 1
        if pending is not None:
            language = fence.group("info").strip().split(" ")[0]
            if language not in SHELLS:
                raise ReadmeMarkerError(
                    f"README line {pending[1]}: a readme-test marker above a {language or 'plain'}"
                    f" block; only shell blocks ({', '.join(sorted(SHELLS))}) run"
                )
            script = "\n".join(lines[index + 1 : end])
            blocks.append(Block(pending[0], script, index + 1))
            pending = None
        index = end + 1
    if pending is not None:
        raise ReadmeMarkerError(f"README line {pending[1]}: a readme-test marker ends the file")
    return blocks


# -- the marker grammar ---------------------------------------------------------------------------


def test_markers_select_the_shell_blocks_directly_below_them() -> None:
    text = "\n".join(
        [
            "# Title",
            "<!-- readme-test: run -->",
            "```bash",
            "echo one \\",
            "    two",
            "```",
            "```bash",
            "echo unmarked",
            "```",
            "<!--readme-test:serve-->",
            "````sh",
            "```",
            "rollcap capture view x",
            "````",
            "```python",
            "<!-- readme-test: run -->",  # inside a block: code, not a marker
            "```",
        ]
    )
    assert marked_blocks(text) == [
        Block("run", "echo one \\\n    two", 3),
        Block("serve", "```\nrollcap capture view x", 11),
    ]
    assert marked_blocks(text)[0].first_line == "echo one \\"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- readme-test: run -->\n\n```bash\necho\n```", "directly above a fence"),
        ("<!-- readme-test: run -->\nsome prose", "directly above a fence"),
        ("<!-- readme-test: runs -->\n```bash\necho\n```", "the mode must be one of run, serve"),
        ("<!-- readme-test -->\n```bash\necho\n```", "the mode must be one of"),
        ("<!-- readme-test: run -->\n```python\nprint()\n```", "above a python block"),
        ("text\n<!-- readme-test: run -->", "ends the file"),
    ],
)
def test_a_marker_that_marks_nothing_runnable_is_an_error(text: str, message: str) -> None:
    with pytest.raises(ReadmeMarkerError, match=message):
        marked_blocks(text)


# -- the README's commands ------------------------------------------------------------------------


def _workspace(tmp_path: Path) -> Path:
    """The reader's working directory: a checkout's example data, nothing else."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(ROOT / "resources_servers", work / "resources_servers")
    return work


def _shell_env(head_url: str, capture_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The venv's rollcap and gym first, as an activated venv (or `pip install rollcap`) has them.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ROLLCAP_HEAD_URL"] = head_url
    env["capture_dir"] = str(capture_dir)  # as the README's first block sets it
    return env


async def _run(block: Block, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run one block; its exit status, stdout and stderr (with what the test did, for a serve
    block)."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-eu",
        "-o",
        "pipefail",
        "-c",
        block.script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, which a serve block's Ctrl-C goes to
    )
    assert proc.stdout is not None
    printed: list[str] = []
    note = ""
    try:
        async with asyncio.timeout(BLOCK_BOUND_S):
            if block.mode == "serve":
                url = None
                while url is None:
                    line = await proc.stdout.readline()
                    if not line:  # it ended without serving
                        break
                    printed.append(line.decode())
                    url = _URL.search(printed[-1])
                if url is None:
                    note = "\n[test: the block printed no http://127.0.0.1:<port>/ URL]"
                else:
                    page = await asyncio.to_thread(_get, url.group(0))
                    printed.append(f"[test: GET {url.group(0)}: {len(page)} bytes; Ctrl-C]\n")
                    os.killpg(proc.pid, signal.SIGINT)  # as a reader stops it
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    code = proc.returncode
    assert code is not None
    if note:
        code = code or 1
    return code, "".join(printed) + out.decode(), err.decode() + note


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as answer:
        body: bytes = answer.read()
        assert answer.status == 200, (url, answer.status)
        return body


async def test_the_readme_s_marked_commands_run_as_written(tmp_path: Path) -> None:
    from rollcap.config import load_config
    from rollcap.testing import FakeUpstream
    from rollcap.workflow import environment
    from tests.conftest import SECRETS

    blocks = marked_blocks(README.read_text(encoding="utf-8"))
    assert blocks, (
        "README.md marks no block with <!-- readme-test: run --> (or serve) above its fence: "
        "this test would run nothing"
    )
    assert shutil.which("jq") is not None or not any("jq" in b.script for b in blocks), (
        "the README's commands use jq, which is not installed: `make test` installs it "
        "(apt-get install jq)"
    )
    work = _workspace(tmp_path)
    capture_dir = work / "results" / "model-calls"
    capture_dir.mkdir(parents=True)
    async with FakeUpstream(api_key=SECRETS[0]) as upstream:
        config = load_config(
            overrides=[
                f"++policy_base_url={upstream.url}/v1",
                f"++policy_api_key={SECRETS[0]}",
                "++policy_model_name=gpt-4.1",
                "++observability_enabled=true",
                f"++model_call_capture_dir={capture_dir}",
                "++mcqa.resources_servers.mcqa={}",
                "++calculator.resources_servers.calculator={}",
                "++mcqa_simple_agent.responses_api_agents.mcqa_simple_agent={}",
                "++simple_agent.responses_api_agents.simple_agent={}",
            ],
            env_file=None,
        )
        async with environment(config, model_type="openai_model", head_port=0) as env:
            shell = _shell_env(env.head_url, capture_dir)
            for block in blocks:
                code, out, err = await _run(block, work, shell)
                where = f"README line {block.line} ({block.mode}: {block.first_line!r})"
                assert code == 0, f"{where} exited {code}\n--- stdout\n{out}\n--- stderr\n{err}"
                nulls = [line for line in out.splitlines() if line.strip() == "null"]
                assert not nulls, f"{where} printed null: a filter names a missing key\n{out}"
    assert upstream.requests, "the README's commands never reached the model"
