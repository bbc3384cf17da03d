"""What a rollout line says of its task and grading: the transcript's header."""

from __future__ import annotations

from typing import Any

from rollcap.collect import Rollout, rollout_line
from rollcap.report._facts import LIST_MAX, TEXT_MAX, facts_text, line_facts

QUESTION = "What is 17 + 25?"
RESPONSE = {
    "object": "response",
    "output": [
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "42"}],
        },
    ],
}


def _line(task: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    return rollout_line(Rollout(3, 1, 0, task), answer)


def test_a_collected_line_gives_input_expected_answer_final_answer_and_verifier() -> None:
    task = {
        "responses_create_params": {
            "instructions": "Use the tools.",
            "input": [{"role": "user", "content": QUESTION}],
        },
        "expected_answer": 42,
    }
    answer = {
        "response": RESPONSE,
        "reward": 1.0,
        "extracted_answer": 42,
        "resolved": True,
        "judge": {"score": 0.9},
    }
    line = _line(task, answer)
    # As collection leaves it (the trajectory's other fields do not matter here).
    line["ng_trajectory"] = {
        "tool_calls": [
            {
                "tool_call_id": "c1",
                "tool_name": "add",
                "started_at": 10.0,
                "completed_at": 10.25,
                "duration_ms": 250.0,
                "status": "completed",
                "output": "42",
            },
            {"tool_name": "no id: not a run"},
        ]
    }
    facts = line_facts(line)
    assert facts["input"] == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": QUESTION},
    ]
    assert facts["expected"] == {"field": "expected_answer", "value": 42}
    assert facts["answer"] == "42"
    # Every field the verifier added, in its order; not the evidence, the prompt or the target.
    assert facts["verifier"] == {"extracted_answer": 42, "resolved": True, "judge": {"score": 0.9}}
    assert facts["tool_runs"] == [
        {
            "id": "c1",
            "tool_name": "add",
            "started_at": 10.0,
            "completed_at": 10.25,
            "duration_ms": 250.0,
            "status": "completed",
        }
    ]
    assert facts_text(facts) == [
        "42",
        "42",
        "42",
        "True",
        "{'score': 0.9}",
        "Use the tools.",
        QUESTION,
    ]


def test_the_expected_answer_is_the_first_known_field_and_echoed_task_fields_are_not_verifier() -> (
    None
):
    task = {"question": "2 + 2?", "ground_truth": "4", "answer": "not this one"}
    # An agent that echoes the task in its answer, as NeMo Gym's verify responses do.
    answer = {
        "response": "4",
        "reward": 0.0,
        "responses_create_params": {"input": "2 + 2?"},
        "ground_truth": "4",
        "extracted_answer": "5",
    }
    facts = line_facts(_line(task, answer))
    assert facts["expected"] == {"field": "ground_truth", "value": "4"}
    assert facts["input"] == [{"role": "user", "content": "2 + 2?"}]
    assert facts["answer"] == "4"
    assert facts["verifier"] == {"extracted_answer": "5"}


def test_answers_of_each_dialect_and_of_no_known_shape() -> None:
    def answer_of(response: Any) -> Any:
        return line_facts({"response": response, "reward": 0})["answer"]

    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}]}
    assert answer_of(chat) == "Paris"
    messages = {"type": "message", "content": [{"type": "text", "text": "Paris"}]}
    assert answer_of(messages) == "Paris"
    assert answer_of({"text": "Paris"}) == "Paris"
    assert answer_of({"output": "not a list"}) is None
    assert answer_of({"unknown": 1}) is None
    assert answer_of(None) is None


def test_long_texts_and_lists_are_cut_and_say_so() -> None:
    long = "x" * (TEXT_MAX + 10)
    facts = line_facts({"question": long, "reward": 0, "notes": list(range(LIST_MAX + 5))})
    assert facts["input"][0]["content"] == "x" * TEXT_MAX + " … (10 more characters)"
    assert facts["verifier"]["notes"] == list(range(LIST_MAX))
    assert facts["expected"] is None
    assert line_facts({})["input"] is None
