"""Two more real runs for the report's transcript and divergence tests.

- ``calculator_run``: the calculator tasks through the simple agent, a capturing model server and
  collection, the fake upstream playing ``tool_turns`` (two tool calls, then its answer): each
  rollout is three calls with two timed tool runs in its line's ``ng_trajectory``.
- ``variants_run``: task 0 twice through the official OpenAI SDK. ``0-0`` asks, then its
  follow-up fails with a 500 and is sent again; ``0-1`` asks the same streamed, so the two part at
  call 0 on the ``stream`` parameter alone. Their lines' answers are ``ANSWERS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import openai
import orjson

from rollcap.collect import Rollout, rollout_line
from rollcap.gym import example_data_path
from rollcap.testing import HEADER_SCENARIO
from tests.gym.conftest import calculator_stack
from tests.report._evaluation import evaluation_servers

CALCULATOR_TASKS = 2
CALCULATOR_ROLLOUTS = "calculator_rollouts.jsonl"
ANSWERS = {"0-0": "Olympus Mons stands on Mars.", "0-1": "The tallest one is on Venus."}
QUESTION = "Where is the tallest volcano of the solar system?"
FOLLOW_UP = "How tall is it?"


async def _calculator(job_dir: Path) -> None:
    from rollcap.collect import collect

    tasks = example_data_path("calculator").read_bytes().splitlines()[:CALCULATOR_TASKS]
    source = job_dir / "tasks.jsonl"
    source.write_bytes(b"\n".join(tasks) + b"\n")
    capture = job_dir / "model-calls"
    async with calculator_stack(capture) as stack, asyncio.timeout(60):
        await collect(stack.agent_url, source, job_dir / CALCULATOR_ROLLOUTS, capture_dir=capture)


def run_in_thread(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` to its end on an event loop of a thread of its own, so that a caller
    whose thread runs an event loop (Playwright's) can too; its exception is raised here."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def calculator_run(job_dir: Path) -> None:
    """The calculator run (module doc) into ``job_dir`` (``run_in_thread``)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    run_in_thread(lambda: _calculator(job_dir))


def variants_run(job_dir: Path) -> None:
    """The variants run (module doc), an ``eval submit``-style job directory."""
    job_dir.mkdir(parents=True, exist_ok=True)
    with evaluation_servers(job_dir) as run:
        for index, stream in ((0, False), (1, True)):
            rollout_id = f"0-{index}"
            client = run.openai(rollout_id)
            messages: list[Any] = [{"role": "user", "content": QUESTION}]
            if stream:
                for _ in client.chat.completions.create(
                    model="fake-model", messages=messages, stream=True
                ):
                    pass
            else:
                client.chat.completions.create(model="fake-model", messages=messages)
                messages += [
                    {"role": "assistant", "content": "On Mars."},
                    {"role": "user", "content": FOLLOW_UP},
                ]
                with contextlib.suppress(openai.InternalServerError):
                    client.chat.completions.create(
                        model="fake-model",
                        messages=messages,
                        extra_headers={HEADER_SCENARIO: "http_500"},
                    )
                client.chat.completions.create(model="fake-model", messages=messages)
            task = {"question": QUESTION, "expected_answer": "Mars"}
            line = rollout_line(
                Rollout(0, index, 0, task),
                {"response": {"text": ANSWERS[rollout_id]}, "reward": float(index == 0)},
            )
            with run.rollouts_file.open("ab") as handle:
                handle.write(orjson.dumps(line) + b"\n")
