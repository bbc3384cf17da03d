"""The fake upstream's knobs: which scenario a request asks for, and its ``x-fake-*`` headers.

A request is answered by a *scenario*: the ``x-fake-scenario`` header, else the request's ``model``
when it names a scenario, else ``text``. The scenarios are listed for users in the package
docstring (``rollcap.testing``), and here in ``SCENARIOS``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from rollcap._json import as_str

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_TOOL_TURNS",
    "DIALECTS",
    "HEADER_CACHED_TOKENS",
    "HEADER_CHUNK_DELAY_MS",
    "HEADER_CONTENT_BYTES",
    "HEADER_DELAY_MS",
    "HEADER_EVENTS",
    "HEADER_SCENARIO",
    "HEADER_TOOL_TURNS",
    "MAX_CHOICE_SEED",
    "SCENARIOS",
    "KnobError",
    "Knobs",
    "choice_seed",
    "http_status",
    "read_knobs",
]


DIALECTS: Final = ("responses", "chat", "messages")
DEFAULT_MODEL: Final = "fake-model"

HEADER_SCENARIO: Final = "x-fake-scenario"
HEADER_EVENTS: Final = "x-fake-events"
HEADER_CONTENT_BYTES: Final = "x-fake-content-bytes"
HEADER_CACHED_TOKENS: Final = "x-fake-cached-tokens"
HEADER_DELAY_MS: Final = "x-fake-delay-ms"
HEADER_CHUNK_DELAY_MS: Final = "x-fake-chunk-delay-ms"
HEADER_TOOL_TURNS: Final = "x-fake-tool-turns"
DEFAULT_TOOL_TURNS: Final = 2

# Scenarios that complete (their stream ends with the dialect's terminal event).
_COMPLETING = ("text", "tool", "tool_turns", "reasoning", "incomplete", "choice")
_FAILING = ("malformed_json", "truncate", "stream_error", "hang", "disconnect", "endless")
_HTTP_ERRORS = ("http_400", "http_401", "http_404", "http_429", "http_500", "http_503")
_REFUSING = ("context_length",)
SCENARIOS: Final = _COMPLETING + _FAILING + _HTTP_ERRORS + _REFUSING
"""The named scenarios. Besides these, ``http_<status>`` answers any status from 400 to 599 and
``choice-<seed>`` is ``choice`` with that seed (0 to ``MAX_CHOICE_SEED``)."""

MAX_CHOICE_SEED: Final = 2**31

# Upper bounds on the knobs, so that a typo cannot make the fake build gigabytes.
_MAX_EVENTS = 1_000_000
_MAX_BYTES = 100_000_000
_MAX_DELAY_MS = 3_600_000.0


class KnobError(ValueError):
    """A request header or body that selects something the fake does not have."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the request asks of the fake, read from its ``x-fake-*`` headers and its model.

    ``seed``: the seed of ``choice-<seed>``, whose ``scenario`` is then ``choice`` (0 otherwise).
    """

    scenario: str = "text"
    events: int | None = None
    content_bytes: int | None = None
    cached_tokens: int | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    tool_turns: int = DEFAULT_TOOL_TURNS
    seed: int = 0


def http_status(scenario: str) -> int | None:
    match = re.fullmatch(r"http_([45]\d\d)", scenario)
    return int(match.group(1)) if match else None


def choice_seed(scenario: str) -> int | None:
    """The seed ``choice-<seed>`` names (``choice``: 0), else ``None``, also when out of range."""
    # At most 10 digits: 2**31 has 10, and a longer run of digits is never parsed.
    match = re.fullmatch(r"choice(?:-([0-9]{1,10}))?", scenario)
    if match is None:
        return None
    seed = int(match.group(1) or 0)
    return seed if seed <= MAX_CHOICE_SEED else None


def _is_scenario(name: str) -> bool:
    return name in SCENARIOS or http_status(name) is not None or choice_seed(name) is not None


def _count(headers: Mapping[str, str], name: str, limit: int) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > limit:
        raise KnobError(f"{name} must be an integer from 0 to {limit}, got {value!r}")
    return int(text)


def _delay(headers: Mapping[str, str], name: str) -> float:
    value = headers.get(name)
    if value is None:
        return 0.0
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not 0.0 <= ms <= _MAX_DELAY_MS:  # also false for NaN
        raise KnobError(f"{name} must be a number of milliseconds from 0 to {_MAX_DELAY_MS:g}")
    return ms / 1000.0


def read_knobs(headers: Mapping[str, str], body: Mapping[str, Any]) -> Knobs:
    """Read the knobs; ``headers`` is case-insensitive or has lower-case names.

    Raises ``KnobError`` for an unknown scenario or a header value out of range.
    """
    scenario = headers.get(HEADER_SCENARIO)
    if scenario is not None:
        scenario = scenario.strip()
        if not _is_scenario(scenario):
            raise KnobError(
                f"unknown {HEADER_SCENARIO} {scenario!r}: expected one of "
                f"{', '.join(SCENARIOS)}, http_<status> or choice-<seed>"
            )
    else:
        model = as_str(body.get("model"))
        scenario = model if model is not None and _is_scenario(model) else "text"
    tool_turns = _count(headers, HEADER_TOOL_TURNS, _MAX_EVENTS)
    seed = choice_seed(scenario)
    return Knobs(
        scenario="choice" if seed is not None else scenario,
        events=_count(headers, HEADER_EVENTS, _MAX_EVENTS),
        content_bytes=_count(headers, HEADER_CONTENT_BYTES, _MAX_BYTES),
        cached_tokens=_count(headers, HEADER_CACHED_TOKENS, _MAX_BYTES),
        delay_s=_delay(headers, HEADER_DELAY_MS),
        chunk_delay_s=_delay(headers, HEADER_CHUNK_DELAY_MS),
        tool_turns=DEFAULT_TOOL_TURNS if tool_turns is None else tool_turns,
        seed=seed or 0,
    )
