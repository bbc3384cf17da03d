"""MCQA: grade a multiple-choice answer by the option letter the model chose.

Task lines (JSONL, one task per line) hold:

- ``responses_create_params``: the OpenAI Responses request the agent sends, without ``model``
  (the agent fills in its own): ``input`` carries the question, the lettered options and an
  instruction to answer with the letter.
- ``options``: a list of one-key objects in display order, ``[{"A": "Venus"}, {"B": "Mars"}]``.
  A single object ``{"A": "Venus", "B": "Mars"}`` is accepted too. Keys are single upper-case
  letters ``A``-``Z``; there are at least two, no letter twice.
- ``expected_answer``: the correct option's letter (case and surrounding spaces do not matter).

``POST /verify`` takes a task line plus ``response`` (a Responses response object) and answers
``{"reward": 1.0 | 0.0, "extracted_answer": "B" | null}``: 1.0 exactly when the extracted
letter is the expected one.

The answer text is the ``output_text`` parts of the response's ``message`` output items, joined
with newlines (reasoning and refusals are not answers). ``extract_answer`` reads one letter from
it; see its docstring for the rule.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rollcap._json import json_type_name
from rollcap.gym._http import InvalidRequest
from rollcap.gym._resources import ResourcesServer

__all__ = [
    "McqaResourcesServer",
    "McqaTask",
    "answer_text",
    "extract_answer",
    "parse_mcqa_task",
]

# A letter token: one letter that is not part of a word. A hyphen or apostrophe joins it to a
# neighbouring word ("B-12", "A-list", "I'd") but a quote around it does not ("'B'").
# re reads the \u escapes: typographic quotes and dashes spelled out, not pasted in.
_TOKEN_BEFORE = r"(?<!\w)(?<!\w[-'\u2019])"
_TOKEN_AFTER = r"(?![\w]|[-'\u2019]\w)"

_DECLARATION = re.compile(
    r"\b(?:answer|(?:correct|right|best|final)[ \t]+(?:option|choice|letter))\b"
    # Anything that may sit between the key phrase and the letter: spacing, markdown, brackets,
    # quotes, separators and a few linking words ("is", "would be", "option", ...).
    r"(?:[\s*_~`:=\-\u2013\u2014(\[{<\"'\u201c\u2018]"
    r"|\b(?:is|was|be|would|will|should|must|therefore|thus|clearly|probably|likely"
    r"|definitely|then|option|letter|choice)\b)*"
    rf"{_TOKEN_BEFORE}(?P<letter>[A-Za-z]){_TOKEN_AFTER}",
    re.IGNORECASE,
)
_MENTION = re.compile(rf"{_TOKEN_BEFORE}(?P<letter>[A-Z]){_TOKEN_AFTER}")
# After a declared "a": a word on the same line means it was the article ("the answer is a
# planet"), not an option.
_WORD_FOLLOWS = re.compile(r"[ \t]*[^\W\d_]")
_NEXT_WORD = re.compile(r"[ \t]+([a-z]+)")
# "A" followed by one of these is the option ("A is correct"); followed by any other lower-case
# word it is the article ("A whale is a mammal").
_OPTION_A_VERBS = frozenset(
    {
        "is",
        "was",
        "and",
        "or",
        "seems",
        "looks",
        "would",
        "could",
        "should",
        "might",
        "must",
        "fits",
        "matches",
        "because",
        "since",
        "but",
    }
)
_DECORATION = " \t\r\n*_~`.:;,!?()[]{}<>\"'\u201c\u201d\u2018\u2019"


def _is_english_word(text: str, letter: str, end: int) -> bool:
    """Whether an upper-case "A" or "I" at ``text[end - 1]`` is the article or the pronoun."""
    if letter not in ("A", "I"):
        return False
    following = _NEXT_WORD.match(text, end)
    if following is None:
        return False
    return letter == "I" or following.group(1) not in _OPTION_A_VERBS


def extract_answer(text: str, letters: Collection[str]) -> str | None:
    """The option letter ``text`` answers with, upper-case, or ``None``.

    ``letters`` are the task's option letters (upper-case). Letters outside them are ignored
    everywhere, as ordinary words would be. The first rule that yields a letter wins:

    1. Bare: the whole text, with spaces, markdown, brackets, quotes and punctuation stripped
       from both ends, is one option letter in either case: ``"B"``, ``"(b)"``, ``"**B**."``.
    2. Declared: the last declaration, ``answer`` (or ``correct``/``right``/``best``/``final``
       followed by ``option``/``choice``/``letter``) followed only by spacing, markdown,
       brackets, quotes, separators (``:``, ``=``, hyphen, en and em dash) and linking words
       (``is``, ``would be``, ``therefore``, ``clearly``, ``option``, ...), then a letter token
       in either case: ``"Answer: B"``, ``"the answer is b"``, ``"**Final answer:** (C)"``,
       ``"The correct option is 'D'"``. A lower-case "a" followed by a word on the same line is
       the article and declares nothing (``"the answer is a planet"``; ``"the answer is b
       because ..."`` declares B).
    3. Mentioned: the last upper-case letter token in the text (``"I'd go with C."``,
       ``"D. A whale is a mammal."`` -> D), where an "A" followed by a lower-case word is the
       article unless that word is a verb or conjunction such as ``is``, ``and``, ``seems``
       (``"A is correct"`` counts, ``"A whale"`` does not), and an "I" followed by a lower-case
       word is the pronoun.

    A letter token is a single letter not joined to a word: no letter, digit or underscore on
    either side, and no hyphen or apostrophe linking it to one (``"B-12"``, ``"A-list"``,
    ``"I'd"`` are not tokens; ``"(B)"``, ``"'B'"``, ``"**B**"``, ``"B."`` are).
    """
    allowed = {letter.upper() for letter in letters}
    bare = text.strip(_DECORATION)
    if len(bare) == 1 and bare.upper() in allowed:
        return bare.upper()
    declared: str | None = None
    for match in _DECLARATION.finditer(text):
        letter = match.group("letter")
        if letter.upper() not in allowed:
            continue
        if letter == "a" and _WORD_FOLLOWS.match(text, match.end()):
            continue
        declared = letter.upper()
    if declared is not None:
        return declared
    mentioned: str | None = None
    for match in _MENTION.finditer(text):
        letter = match.group("letter")
        if letter in allowed and not _is_english_word(text, letter, match.end()):
            mentioned = letter
    return mentioned


def answer_text(response: Mapping[str, Any]) -> str:
    """The text of a Responses response's message items, joined with newlines.

    Falls back to a top-level ``output_text`` string (what SDK objects expose) when the output
    holds no message text.
    """
    parts: list[str] = []
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
    if not parts and isinstance(response.get("output_text"), str):
        parts.append(response["output_text"])
    return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class McqaTask:
    """The graded part of a task line: option letter -> text in display order, and the key."""

    options: dict[str, str]
    expected_answer: str


def _option_pairs(options: object) -> list[tuple[object, object]]:
    if isinstance(options, dict):
        return list(options.items())
    if isinstance(options, list):
        pairs: list[tuple[object, object]] = []
        for index, entry in enumerate(options):
            if not isinstance(entry, dict) or len(entry) != 1:
                raise InvalidRequest(
                    f"options[{index}] must be an object with one key, the letter, "
                    f'like {{"A": "text"}}'
                )
            pairs.extend(entry.items())
        return pairs
    raise InvalidRequest(
        "options must be a list of one-key objects or an object of letter -> text, "
        f"got {json_type_name(options)}"
    )


def parse_mcqa_task(body: Mapping[str, Any]) -> McqaTask:
    """Validate a task line's ``options`` and ``expected_answer``; ``InvalidRequest`` if bad."""
    if "options" not in body:
        raise InvalidRequest("the task has no options")
    options: dict[str, str] = {}
    for letter, text in _option_pairs(body["options"]):
        if not (isinstance(letter, str) and len(letter) == 1 and "A" <= letter <= "Z"):
            raise InvalidRequest(f"option letter {letter!r} must be one upper-case letter A-Z")
        if not isinstance(text, str):
            raise InvalidRequest(f"option {letter} must be a string, got {json_type_name(text)}")
        if letter in options:
            raise InvalidRequest(f"option {letter} appears twice")
        options[letter] = text
    if len(options) < 2:
        raise InvalidRequest("the task needs at least two options")
    expected = body.get("expected_answer")
    if not isinstance(expected, str) or expected.strip().upper() not in options:
        raise InvalidRequest(
            f"expected_answer must be one of the option letters {', '.join(options)}, "
            f"got {expected!r}"
        )
    return McqaTask(options, expected.strip().upper())


class McqaResourcesServer(ResourcesServer):
    """Resources server ``mcqa``: reward 1.0 when the answer's letter is the expected one."""

    name = "mcqa"

    async def verify(self, body: dict[str, Any]) -> dict[str, Any]:
        task = parse_mcqa_task(body)
        response = body.get("response")
        if not isinstance(response, dict):
            raise InvalidRequest(
                "verify needs the agent's response, a Responses response object, "
                f"got {json_type_name(response) if 'response' in body else 'none'}"
            )
        extracted = extract_answer(answer_text(response), task.options)
        return {
            "reward": 1.0 if extracted == task.expected_answer else 0.0,
            "extracted_answer": extracted,
        }
