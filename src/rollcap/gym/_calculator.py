"""Calculator: arithmetic tasks an agent solves with three deterministic tools.

The resources server ``calculator`` offers the tools ``add``, ``subtract`` and ``multiply``,
each taking two numbers ``a`` and ``b`` and answering ``{"result": <number>}`` (an int when
both are ints). Task lines (JSONL, one task per line) hold:

- ``responses_create_params``: the OpenAI Responses request the agent sends, without ``model``
  and without ``tools`` (the agent takes the resources server's): ``input`` asks for a
  computation and for the number alone as the answer.
- ``expected_answer``: the number.

``POST /verify`` takes a task line plus ``response`` (a Responses response object) and answers
``{"reward": 1.0 | 0.0, "extracted_answer": <number> | null, "resolved": <bool>}``: the answer
is the last number in the text of the response's message items (thousands separators allowed),
and the reward is 1.0 when it equals ``expected_answer``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from rollcap._json import json_type_name
from rollcap.gym._http import InvalidRequest
from rollcap.gym._mcqa import answer_text
from rollcap.gym._resources import ResourcesServer

__all__ = ["CalculatorResourcesServer", "extract_number"]

Number = int | float

_OPERATIONS: dict[str, tuple[str, Callable[[Number, Number], Number]]] = {
    "add": ("Add two numbers: a + b.", lambda a, b: a + b),
    "subtract": ("Subtract the second number from the first: a - b.", lambda a, b: a - b),
    "multiply": ("Multiply two numbers: a * b.", lambda a, b: a * b),
}
_PARAMETERS = {
    "type": "object",
    "properties": {
        "a": {"type": "number", "description": "The first number."},
        "b": {"type": "number", "description": "The second number."},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
# A number as written in an answer: a sign, digits with optional thousands commas, a fraction.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def extract_number(text: str) -> Number | None:
    """The last number written in ``text`` (``"1,250"`` is 1250), or ``None``."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    written = found[-1].replace(",", "")
    return float(written) if "." in written else int(written)


def _operand(arguments: Mapping[str, Any], name: str) -> Number:
    value = arguments.get(name)
    # bool is an int subclass, and True is not a number a model means.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        got = "nothing" if name not in arguments else json_type_name(value)
        raise InvalidRequest(f"{name} must be a finite number, got {got}")
    return value


class CalculatorResourcesServer(ResourcesServer):
    """Resources server ``calculator``: three arithmetic tools, graded by the final number."""

    name = "calculator"

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": _PARAMETERS,
            }
            for name, (description, _) in _OPERATIONS.items()
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        unknown = set(arguments) - {"a", "b"}
        if unknown:
            raise InvalidRequest(f"{name} takes a and b, not {', '.join(sorted(unknown))}")
        _, operation = _OPERATIONS[name]
        return {"result": operation(_operand(arguments, "a"), _operand(arguments, "b"))}

    async def verify(self, body: dict[str, Any]) -> dict[str, Any]:
        expected = body.get("expected_answer")
        if isinstance(expected, bool) or not isinstance(expected, int | float):
            raise InvalidRequest(f"expected_answer must be a number, got {expected!r}")
        response = body.get("response")
        if not isinstance(response, dict):
            raise InvalidRequest(
                "verify needs the agent's response, a Responses response object, "
                f"got {json_type_name(response) if 'response' in body else 'none'}"
            )
        extracted = extract_number(answer_text(response))
        right = extracted is not None and math.isclose(extracted, expected, abs_tol=1e-9)
        return {"reward": 1.0 if right else 0.0, "extracted_answer": extracted, "resolved": right}
