"""MCQA: the extraction rule, task validation, /verify over HTTP, and the example data."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rollcap._runtime.serving import serving
from rollcap.gym import (
    InvalidRequest,
    McqaResourcesServer,
    create_resources_app,
    example_data_path,
    extract_answer,
    parse_mcqa_task,
)
from rollcap.gym._mcqa import answer_text
from tests.gym.conftest import CLIENT_TIMEOUT, TASK, responses_object

ABCD = "ABCD"
REPO_ROOT = Path(__file__).resolve().parents[2]

EXTRACTION = [
    # Bare answers, any case, any wrapping.
    ("B", "B"),
    ("b", "B"),
    ("  C\n", "C"),
    ("(B)", "B"),
    ("**B**", "B"),
    ("B.", "B"),
    ("[c]", "C"),
    ("'D'", "D"),
    ("“A”", "A"),
    ("A", "A"),
    ("a", "A"),
    # Declarations.
    ("Answer: B", "B"),
    ("answer: b", "B"),
    ("ANSWER: D", "D"),
    ("the answer is b", "B"),
    ("The answer is B.", "B"),
    ("The answer is b because Mars is red.", "B"),
    ("the answer is a", "A"),
    ("Final answer: a", "A"),
    ("**Final answer:** (C)", "C"),
    ("**Answer**: **D**", "D"),
    ("Answer:\n\n**B**", "B"),
    ("The correct option is 'D'.", "D"),
    ("The best choice is B", "B"),
    ("Answer \u2014 C", "C"),
    ("answer = d", "D"),
    ("My answer: (c)", "C"),
    ("The answer would be option (A).", "A"),
    ("the answer is therefore d.", "D"),
    ("I think the answer is D", "D"),
    ("The answer is B, not C.", "B"),
    ("Answer: B. Option A is incorrect because it is too small.", "B"),
    ("The answer is B. Wait, actually the answer is C.", "C"),
    # The article "a" after "answer is" declares nothing; a later letter decides.
    ("the answer is a planet, so C", "C"),
    ("The answer is a gas giant.", None),
    # Mentions: the last standalone capital option letter.
    ("B) Mars", "B"),
    ("C: Jupiter", "C"),
    ("I'd go with C.", "C"),
    ("I would choose B.", "B"),
    ("After thinking it over:\n\nC", "C"),
    ("$\\boxed{C}$", "C"),
    ("Both A and C are plausible, but B is correct.", "B"),
    ("The answer is not A, it's C", "C"),
    ("The answer is I think B", "B"),
    ("A is correct.", "A"),
    ("A. Paris", "A"),
    ("D. A whale is a mammal.", "D"),
    ("Jupiter, which is option C, is the largest.", "C"),
    # Words that start with A, the article, letters joined to words: no answer.
    ("A whale is a mammal.", None),
    ("Antarctica is the coldest place.", None),
    ("Apples and avocados", None),
    ("A-list celebrities", None),
    ("Vitamin B-12", None),
    ("It's a planet", None),
    ("I don't know.", None),
    ("", None),
    ("Hello! This is the rollcap fake upstream answering your request.", None),
    # Letters outside the options are ordinary words.
    ("E", None),
    ("The answer is E.", None),
    ("Option B looks tempting, but the answer is E.", "B"),
    ("Choose X or Y", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION)
def test_extraction(text: str, expected: str | None) -> None:
    assert extract_answer(text, ABCD) == expected


def test_extraction_table_is_large() -> None:
    assert len(EXTRACTION) >= 30


def test_extraction_respects_the_option_set() -> None:
    assert extract_answer("E", "ABCDE") == "E"
    assert extract_answer("The answer is E.", "ABCDE") == "E"
    assert extract_answer("D", "ABC") is None
    assert extract_answer("Answer: d", "abcd") == "D"  # letters given in lower case


def test_answer_text_reads_message_output_text_only() -> None:
    response = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "A or B?"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "First part."},
                    {"type": "refusal", "refusal": "A"},
                ],
            },
            {"type": "function_call", "name": "lookup", "arguments": "{}"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "C"}],
            },
        ]
    }
    assert answer_text(response) == "First part.\nC"
    assert answer_text({"output": [], "output_text": "B"}) == "B"
    assert answer_text({"output": [{"role": "assistant", "content": "D"}]}) == "D"
    assert answer_text({}) == ""
    assert answer_text({"output": "not a list"}) == ""


def test_parse_task_accepts_list_and_mapping_options() -> None:
    listed = parse_mcqa_task({"options": [{"A": "x"}, {"B": "y"}], "expected_answer": " b "})
    mapped = parse_mcqa_task({"options": {"A": "x", "B": "y"}, "expected_answer": "B"})
    assert listed == mapped
    assert listed.options == {"A": "x", "B": "y"}
    assert listed.expected_answer == "B"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"expected_answer": "A"}, "no options"),
        ({"options": "A, B", "expected_answer": "A"}, "options must be a list"),
        ({"options": [{"A": "x", "B": "y"}], "expected_answer": "A"}, "options[0]"),
        ({"options": [{"a": "x"}, {"b": "y"}], "expected_answer": "a"}, "upper-case"),
        ({"options": [{"AB": "x"}, {"C": "y"}], "expected_answer": "C"}, "upper-case"),
        ({"options": [{"A": "x"}, {"A": "y"}], "expected_answer": "A"}, "twice"),
        ({"options": [{"A": "x"}], "expected_answer": "A"}, "at least two"),
        ({"options": [{"A": 1}, {"B": "y"}], "expected_answer": "A"}, "must be a string"),
        ({"options": [{"A": "x"}, {"B": "y"}]}, "expected_answer"),
        ({"options": [{"A": "x"}, {"B": "y"}], "expected_answer": "C"}, "expected_answer"),
    ],
)
def test_parse_task_refuses(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_mcqa_task(body)


# -- /verify over HTTP


@pytest.fixture
async def mcqa() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with (
        serving(create_resources_app(McqaResourcesServer())) as url,
        aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session,
    ):
        yield url, session


async def _post(
    mcqa: tuple[str, aiohttp.ClientSession], path: str, body: object
) -> tuple[int, Any]:
    url, session = mcqa
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with session.post(url + path, data=data) as response:
        assert response.headers["content-type"] == "application/json"
        return response.status, orjson.loads(await response.read())


@pytest.mark.parametrize(
    ("text", "reward", "extracted"),
    [
        ("The answer is C.", 1.0, "C"),
        ("**C**", 1.0, "C"),
        ("B", 0.0, "B"),
        ("No idea, sorry.", 0.0, None),
    ],
)
async def test_verify_over_http(
    mcqa: tuple[str, aiohttp.ClientSession], text: str, reward: float, extracted: str | None
) -> None:
    body = {**TASK, "response": responses_object(text, "m")}
    status, result = await _post(mcqa, "/verify", body)
    assert status == 200
    assert result == {"reward": reward, "extracted_answer": extracted}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got an array"),
        (b'"text"', "must be a JSON object, got a string"),
        ({"response": responses_object("C", "m")}, "no options"),
        ({**TASK}, "verify needs the agent's response"),
        ({**TASK, "response": "C"}, "got a string"),
        ({**TASK, "expected_answer": "Z", "response": {}}, "expected_answer"),
    ],
)
async def test_verify_bad_bodies_are_400(
    mcqa: tuple[str, aiohttp.ClientSession], body: object, message: str
) -> None:
    status, result = await _post(mcqa, "/verify", body)
    assert status == 400
    assert result["error"]["type"] == "invalid_request_error"
    assert message in result["error"]["message"]


async def test_seed_session_and_health(mcqa: tuple[str, aiohttp.ClientSession]) -> None:
    assert await _post(mcqa, "/seed_session", TASK) == (200, {})
    status, result = await _post(mcqa, "/seed_session", b"[]")
    assert status == 400
    assert "must be a JSON object" in result["error"]["message"]
    url, session = mcqa
    async with session.get(url + "/health") as response:
        assert response.status == 200
        assert orjson.loads(await response.read()) == {"status": "ok", "name": "mcqa"}


# -- example data


def test_example_data_copies_are_identical() -> None:
    packaged = example_data_path("mcqa")
    checkout = REPO_ROOT / "resources_servers" / "mcqa" / "data" / "example.jsonl"
    assert packaged.read_bytes() == checkout.read_bytes()


def test_example_data_path_unknown_name() -> None:
    with pytest.raises(KeyError, match="no example data"):
        example_data_path("nope")


def test_every_example_line_validates() -> None:
    raw = example_data_path("mcqa").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode("utf-8").splitlines()
    assert len(lines) >= 20
    questions = set()
    for number, line in enumerate(lines, 1):
        task = orjson.loads(line)
        assert set(task) == {"responses_create_params", "options", "expected_answer"}, number
        parsed = parse_mcqa_task(task)
        letters = list(parsed.options)
        assert letters == [chr(ord("A") + i) for i in range(len(letters))], number
        assert task["expected_answer"] == parsed.expected_answer, number
        params = task["responses_create_params"]
        assert "model" not in params, number
        [message] = params["input"]
        assert message["role"] == "user", number
        content = message["content"]
        for letter, text in parsed.options.items():
            assert f"\n{letter}) {text}\n" in content, (number, letter)
        assert "Answer with the letter" in content, number
        questions.add(content.split("\n", 1)[0])
    assert len(questions) == len(lines), "a question appears twice"


def test_example_answers_are_graded_right() -> None:
    for line in example_data_path("mcqa").read_bytes().splitlines():
        task = parse_mcqa_task(orjson.loads(line))
        right = f"The answer is {task.expected_answer}."
        assert extract_answer(right, task.options) == task.expected_answer
