"""Planning and resume bookkeeping: tasks read lazily, attempts counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.collect import (
    InputError,
    RequestParams,
    ResumeState,
    aggregate_metrics_path,
    count_tasks,
    failures_path,
    iter_tasks,
    plan_rollouts,
    planned_count,
)

LINES = [b'{"q": 0}\n', b"\n", b'{"q": 1}\n', b"   \n", b'{"q": 2}\n']


def test_iter_tasks_skips_blank_lines_and_applies_limit() -> None:
    assert list(iter_tasks(LINES)) == [{"q": 0}, {"q": 1}, {"q": 2}]
    assert list(iter_tasks(LINES, limit=2)) == [{"q": 0}, {"q": 1}]
    assert list(iter_tasks(LINES, limit=0)) == []
    assert count_tasks(LINES, limit=10) == 3


def test_iter_tasks_is_lazy() -> None:
    def lines() -> Any:
        yield b'{"q": 0}'
        raise AssertionError("read past the limit")

    assert list(iter_tasks(lines(), limit=1)) == [{"q": 0}]


@pytest.mark.parametrize(("line", "reason"), [(b"{oops", "not valid JSON"), (b"[1]", "a list")])
def test_bad_input_line_names_its_number(line: bytes, reason: str) -> None:
    with pytest.raises(InputError, match=reason) as info:
        count_tasks([b'{"q": 0}', b"", line])
    assert info.value.line_number == 3


def test_plan_expands_repeats_in_order() -> None:
    plan = list(plan_rollouts(iter_tasks(LINES, limit=2), num_repeats=3))
    assert [(r.task_index, r.rollout_index, r.attempt_index) for r in plan] == [
        (0, 0, 0),
        (0, 1, 0),
        (0, 2, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 2, 0),
    ]
    assert plan[4].task == {"q": 1}
    assert plan[4].run_body() == {
        "q": 1,
        "_ng_task_index": 1,
        "_ng_rollout_index": 1,
        "_ng_attempt_index": 0,
    }
    with pytest.raises(ValueError, match="num_repeats"):
        list(plan_rollouts([{}], num_repeats=0))


def _line(task: int, rollout: int, attempt: int = 0) -> bytes:
    return orjson.dumps(
        {"_ng_task_index": task, "_ng_rollout_index": rollout, "_ng_attempt_index": attempt}
    )


def test_resume_state_counts_attempts() -> None:
    state = ResumeState.from_files(
        output_lines=[_line(0, 0), _line(1, 0, 1), b'{"_ng_task_index": 2, "_ng_rol'],
        failure_lines=[_line(1, 0), _line(2, 0), _line(2, 0, 1), b"garbage"],
        capture_names=[
            "0-0.capture.jsonl",  # finished: not an attempt to count
            "3-0.capture.jsonl",  # dispatched, never finished
            "4-1-a2.capture.incomplete",
            "notes.txt",
        ],
    )
    assert state.finished == {(0, 0), (1, 0)}
    assert state.bad_output_lines == 1
    assert state.attempts == {(2, 0): 2, (3, 0): 1, (4, 1): 3}
    tasks = [{"t": i} for i in range(5)]
    plan = list(plan_rollouts(tasks, num_repeats=2, resume=state))
    assert [r.rollout_id for r in plan] == [
        "0-1",
        "1-1",
        "2-0-a2",
        "2-1",
        "3-0-a1",
        "3-1",
        "4-0",
        "4-1-a3",
    ]
    assert planned_count(5, 2, state) == (8, 2)
    assert planned_count(1, 1, state) == (0, 1)


def test_side_file_names() -> None:
    assert str(failures_path("/r/mcqa_rollouts.jsonl")) == "/r/mcqa_rollouts_failures.jsonl"
    assert str(aggregate_metrics_path("/r/out.jsonl")) == "/r/out_aggregate_metrics.json"


def test_a_compressed_output_s_side_files_are_plain_and_named_as_the_plain_output_s() -> None:
    assert str(failures_path("/r/mcqa_rollouts.jsonl.zst")) == "/r/mcqa_rollouts_failures.jsonl"
    assert str(aggregate_metrics_path(Path("/r/out.jsonl.zst"))) == "/r/out_aggregate_metrics.json"


def test_compacted_capture_files_count_as_attempts() -> None:
    names = ["3-0.capture.jsonl.zst", "4-1-a2.capture.jsonl.zst", ".5-0.capture.jsonl.zst.tmp"]
    state = ResumeState.from_files([], [], names)
    # A compaction's temporary is no capture file: 5-0 never ran.
    assert state.attempts == {(3, 0): 1, (4, 1): 3}


def test_the_journal_is_resume_s_authority_over_a_stale_listing() -> None:
    # Another host lists the capture directory before it sees the newest files: attempt 1 of
    # 5-0 was dispatched (journaled), its file not listed yet. Reusing attempt 1 would reset a
    # file that attempt's agent, maybe still running, appends to.
    stale_listing = ["5-0.capture.jsonl"]
    journal = [_line(5, 0), _line(5, 0, 1), _line(6, 0), b'{"_ng_task_index": 7, "_ng_rollo']
    state = ResumeState.from_files([], [], stale_listing, journal)
    assert state.attempts == {(5, 0): 2, (6, 0): 1}
    assert [r.rollout_id for r in plan_rollouts([{}] * 8, resume=state)][5:] == [
        "5-0-a2",
        "6-0-a1",
        "7-0",  # its journal line was torn: never dispatched
    ]
    # Without the journal, the stale listing alone would hand out attempt 1 again.
    assert ResumeState.from_files([], [], stale_listing).next_attempt((5, 0)) == 1


def test_request_params_merge_over_the_task_and_seed_each_rollout() -> None:
    task = {"responses_create_params": {"input": "q", "temperature": 0.0, "seed": 99}, "x": 1}
    params = RequestParams({"temperature": 0.7, "max_output_tokens": 16}, rollout_seed=5)
    plan = list(plan_rollouts([task], num_repeats=3, params=params))
    assert [r.task["responses_create_params"] for r in plan] == [
        {"input": "q", "temperature": 0.7, "max_output_tokens": 16, "seed": seed}
        for seed in (5, 6, 7)  # the run's seed wins over the task's
    ]
    assert all(r.task["x"] == 1 for r in plan)
    assert plan[1].run_body()["responses_create_params"]["seed"] == 6
    # The input's task is shared by the repeats and left as it was read.
    assert task == {
        "responses_create_params": {"input": "q", "temperature": 0.0, "seed": 99},
        "x": 1,
    }


def test_request_params_replace_a_key_whole_and_leave_other_tasks_alone() -> None:
    params = RequestParams({"text": {"format": {"type": "text"}}})
    task = {"responses_create_params": {"input": "q", "text": {"verbosity": "low"}}}
    assert params.apply(task, 0) == {
        "responses_create_params": {"input": "q", "text": {"format": {"type": "text"}}}
    }
    # A task whose agent reads other fields, or a malformed one its agent will refuse: as it is.
    for other in ({"question": "q"}, {"responses_create_params": "q"}):
        assert params.apply(other, 0) is other
    # Without overrides or a seed every repeat is the input's task itself.
    plain = {"responses_create_params": {"input": "q"}}
    assert RequestParams().empty
    assert all(r.task is plain for r in plan_rollouts([plain], 2, params=RequestParams()))


def test_request_params_keep_their_own_copy_and_refuse_a_bad_seed() -> None:
    overrides = {"temperature": 0.5}
    params = RequestParams(overrides)
    overrides["temperature"] = 2.0
    assert params.apply({"responses_create_params": {}}, 0) == {
        "responses_create_params": {"temperature": 0.5}
    }
    for seed in (-1, True, 1.5, "1"):
        with pytest.raises(ValueError, match="rollout_seed must be an integer >= 0"):
            RequestParams(rollout_seed=seed)  # type: ignore[arg-type]


def test_a_retried_attempt_sends_its_rollout_s_seed_again() -> None:
    # A rerun must reproduce a rollout: the seed follows (task, rollout), never the attempt id.
    state = ResumeState.from_files([_line(0, 0)], [_line(0, 1)])
    task = {"responses_create_params": {"input": "q"}}
    plan = list(plan_rollouts([task], 3, state, RequestParams(rollout_seed=10)))
    assert [(r.rollout_id, r.task["responses_create_params"]["seed"]) for r in plan] == [
        ("0-1-a1", 11),
        ("0-2", 12),
    ]
