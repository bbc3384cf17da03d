"""A collection's status document: counts, states, what each running rollout is doing, and the
order a person reads them in."""

from __future__ import annotations

from typing import Any

from rollcap.status import LiveStatusSettings, RunBoard, ServerAnswer

SETTINGS = LiveStatusSettings(
    stalled_upstream_s=5, stalled_between_calls_s=20, slow_factor=2, slow_min_finished=2
)


def _board(planned: int = 10) -> RunBoard:
    return RunBoard(
        SETTINGS,
        run_id="/runs/out.jsonl",
        agent="simple_agent",
        planned=planned,
        skipped=3,
        started=100.0,
        started_at=1_700_000_000.0,
    )


def _start(board: RunBoard, task: int, now: float, *, attempt: int = 0, again: bool = False) -> str:
    rollout_id = f"{task}-0" + (f"-a{attempt}" if attempt else "")
    board.start(
        rollout_id, task_index=task, rollout_index=0, attempt=attempt, redispatched=again, now=now
    )
    return rollout_id


def _open_call(state: str, *, silence_ms: float, age_ms: float = 1000.0) -> dict[str, Any]:
    return {
        "rollout_id": "x",
        "dialect": "responses",
        "state": state,
        "phase": "streaming",
        "started_at": 1.0,
        "age_ms": age_ms,
        "upstream_silence_ms": silence_ms,
    }


def test_counts_rate_and_eta() -> None:
    board = _board(planned=4)
    for task in range(3):
        _start(board, task, 100.0)
    board.end("0-0", "ok", 102.0)
    board.end("1-0", "failed", 104.0)
    board.end("2-0", "lost", 104.0)
    _start(board, 2, 104.0, attempt=1, again=True)
    document = board.document(110.0, 1_700_000_010.0)
    assert document["counts"] == {
        "planned": 4,
        "skipped": 3,
        "running": 1,
        "done": 2,
        "failed": 1,
        "lost": 1,
        "retried": 1,
    }
    assert document["rate_per_s"] == 0.2  # 2 done in 10 s
    assert document["eta_s"] == 10.0  # 2 to go at 0.2/s
    assert document["run"] == {
        "id": "/runs/out.jsonl",
        "agent": "simple_agent",
        "started_at": 1_700_000_000.0,
        "updated_at": 1_700_000_010.0,
        "elapsed_s": 10.0,
        "finished": False,
    }
    (rollout,) = document["rollouts"]
    assert (rollout["rollout_id"], rollout["attempt"], rollout["state"]) == (
        "2-0-a1",
        1,
        "retrying",
    )
    assert rollout["doing"] == {"kind": "unknown"}  # no model server was asked
    assert document["thresholds"] == SETTINGS.to_dict()


def test_without_a_model_server_asked_nothing_stalls_between_calls() -> None:
    board = _board()
    _start(board, 0, 100.0)
    assert board.document(1000.0, 0.0)["rollouts"][0]["state"] == "active"


def test_what_the_model_servers_say_makes_the_states() -> None:
    board = _board()
    stuck_in_call = _start(board, 0, 100.0)
    stuck_in_tool = _start(board, 1, 100.0)
    busy = _start(board, 2, 100.0)
    fresh = _start(board, 3, 119.0)  # no call yet, and not for long
    gave_up = _start(board, 4, 100.0)
    answers = [
        ServerAnswer(
            "policy_model",
            "http://a",
            rollouts={
                stuck_in_call: {
                    "calls_ended": 2,
                    "last_call_ended_ms_ago": 9000.0,
                    "open_calls": [_open_call("stalled", silence_ms=7000.0, age_ms=8000.0)],
                },
                stuck_in_tool: {"calls_ended": 1, "last_call_ended_ms_ago": 25_000.0},
                gave_up: {
                    "calls_ended": 1,
                    "last_call_ended_ms_ago": 1000.0,
                    "last_call_cancelled": True,
                },
            },
        ),
        ServerAnswer(
            "judge_model",
            "http://b",
            rollouts={
                busy: {"calls_ended": 4, "open_calls": [_open_call("active", silence_ms=10.0)]},
                # The most recent end, on any server, is the one that counts.
                stuck_in_tool: {"calls_ended": 3, "last_call_ended_ms_ago": 30_000.0},
            },
        ),
        ServerAnswer("down_model", "http://c", error="ClientConnectorError"),
    ]
    board.observe(answers, 120.0)
    document = board.document(120.0, 0.0)
    by_id = {r["rollout_id"]: r for r in document["rollouts"]}
    assert by_id[stuck_in_call]["state"] == "stalled"
    assert by_id[stuck_in_call]["calls"] == 3  # two ended and one open
    assert by_id[stuck_in_call]["doing"] == {
        "kind": "model_call",
        "server": "policy_model",
        "dialect": "responses",
        "phase": "streaming",
        "state": "stalled",
        "for_s": 8.0,
        "upstream_silence_s": 7.0,
        "open_calls": 1,
    }
    assert by_id[stuck_in_tool]["state"] == "stalled"
    assert by_id[stuck_in_tool]["calls"] == 4
    assert by_id[stuck_in_tool]["doing"] == {"kind": "between_calls", "for_s": 25.0}
    assert by_id[busy]["state"] == "active"
    assert by_id[busy]["doing"]["server"] == "judge_model"
    assert by_id[fresh]["state"] == "active"
    assert by_id[fresh]["doing"] == {"kind": "between_calls", "for_s": 1.0}
    assert by_id[gave_up]["state"] == "cancelled"
    assert document["states"] == {
        "stalled": 2, "cancelled": 1, "retrying": 0, "slow": 0, "active": 2,
    }  # fmt: skip
    # Stalled first, then cancelled, then the others, oldest first within a state.
    assert [r["rollout_id"] for r in document["rollouts"]] == [
        stuck_in_call, stuck_in_tool, gave_up, busy, fresh,
    ]  # fmt: skip
    assert [s["ok"] for s in document["servers"]] == [True, True, False]
    assert document["servers"][2]["error"] == "ClientConnectorError"
    # A poll nobody answered changes nothing of what the last one said.
    board.observe([ServerAnswer("policy_model", "http://a", error="timeout")], 121.0)
    assert board.document(121.0, 0.0)["rollouts"][0]["rollout_id"] == stuck_in_call


def test_a_rollout_past_the_runs_p95_is_slow() -> None:
    board = _board()
    for task in range(2):
        _start(board, task, 100.0)
        board.end(f"{task}-0", "ok", 110.0)  # 10 s each
    long_one = _start(board, 5, 100.0)
    assert board.document(119.0, 0.0)["slow_after_s"] is not None
    assert board.document(119.0, 0.0)["rollouts"][0]["state"] == "active"
    document = board.document(121.0, 0.0)  # past 2 x 10 s
    assert document["rollouts"][0] == {**document["rollouts"][0], "rollout_id": long_one}
    assert document["rollouts"][0]["state"] == "slow"


def test_the_list_is_bounded_and_finished_runs_have_no_eta() -> None:
    board = _board(planned=500)
    for task in range(300):
        _start(board, task, 100.0)
    document = board.document(101.0, 0.0, limit=50)
    assert len(document["rollouts"]) == 50
    assert document["counts"]["running"] == 300
    board.finished = True
    assert board.document(101.0, 0.0)["eta_s"] is None
