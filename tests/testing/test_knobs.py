"""The knobs: scenario selection and the ``x-fake-*`` headers, read and applied."""

from __future__ import annotations

import pytest

from rollcap.dialects import reassemble
from rollcap.testing import SCENARIOS
from rollcap.testing._knobs import DIALECTS, MAX_CHOICE_SEED, KnobError, choice_seed, read_knobs
from tests.testing._support import (
    decode,
    json_of,
    reply,
    request,
    streamed,
)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("count", [0, 1, 5, 40])
def test_events_header_sets_the_number_of_text_deltas(dialect: str, count: int) -> None:
    delta = {
        "responses": "response.output_text.delta",
        "chat": '"content"',
        "messages": "text_delta",
    }[dialect]
    headers = {"x-fake-events": str(count)}
    events = decode(streamed(dialect, request(dialect), headers).events)
    deltas = [e for e in events if delta in e.data and '"role"' not in e.data]
    assert len(deltas) == count
    result = reassemble(dialect, streamed(dialect, request(dialect), headers).events)
    assert result.response == json_of(reply(dialect, request(dialect), headers))


@pytest.mark.parametrize("size", [1, 100, 10_000])
def test_content_bytes_header_sizes_the_text(size: int) -> None:
    body = json_of(reply("chat", request("chat"), {"x-fake-content-bytes": str(size)}))
    assert len(body["choices"][0]["message"]["content"].encode()) == size


def test_content_bytes_and_events_together() -> None:
    headers = {"x-fake-content-bytes": "1000", "x-fake-events": "4"}
    stream = streamed("messages", request("messages"), headers)
    deltas = [e for e in decode(stream.events) if "text_delta" in e.data]
    assert len(deltas) == 4
    result = reassemble("messages", stream.events).response
    assert result is not None
    assert len(result["content"][0]["text"]) == 1000


def test_scenario_comes_from_header_then_model_then_default() -> None:
    assert read_knobs({}, {"model": "gpt"}).scenario == "text"
    assert read_knobs({}, {"model": "tool"}).scenario == "tool"
    assert read_knobs({"x-fake-scenario": "reasoning"}, {"model": "tool"}).scenario == "reasoning"
    assert read_knobs({}, {"model": "http_418"}).scenario == "http_418"


def test_choice_takes_its_seed_from_the_name() -> None:
    knobs = read_knobs({}, {"model": "choice"})
    assert (knobs.scenario, knobs.seed) == ("choice", 0)
    knobs = read_knobs({}, {"model": "choice-7"})
    assert (knobs.scenario, knobs.seed) == ("choice", 7)
    knobs = read_knobs({"x-fake-scenario": f"choice-{MAX_CHOICE_SEED}"}, {"model": "choice-7"})
    assert (knobs.scenario, knobs.seed) == ("choice", 2**31)
    assert read_knobs({"x-fake-scenario": "choice-0"}, {}) == read_knobs({}, {"model": "choice"})
    assert choice_seed("choice-12") == 12
    for name in ("choice-x", "choice-", "choice--1", "choice-2147483649", "choice-\uff11", "chose"):
        assert choice_seed(name) is None, name
        # As a model name it names no scenario: an ordinary model, answered with text.
        assert read_knobs({}, {"model": name}) == read_knobs({}, {})


def test_delays_are_read_in_milliseconds() -> None:
    knobs = read_knobs({"x-fake-delay-ms": "250", "x-fake-chunk-delay-ms": "1.5"}, {})
    assert knobs.delay_s == 0.25
    assert knobs.chunk_delay_s == 0.0015


def test_tool_turns_default_to_two_and_take_zero() -> None:
    assert read_knobs({}, {}).tool_turns == 2
    assert read_knobs({"x-fake-tool-turns": "5"}, {}).tool_turns == 5
    assert read_knobs({"x-fake-tool-turns": "0"}, {}).tool_turns == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-fake-scenario", "nope"),
        ("x-fake-scenario", "http_200"),
        ("x-fake-scenario", "choice-x"),
        ("x-fake-scenario", "choice-2147483649"),
        ("x-fake-scenario", "choice-99999999999"),
        ("x-fake-events", "-1"),
        ("x-fake-events", "many"),
        ("x-fake-events", "1000001"),
        ("x-fake-content-bytes", "1e3"),
        ("x-fake-delay-ms", "soon"),
        ("x-fake-delay-ms", "-5"),
        ("x-fake-chunk-delay-ms", "nan"),
        ("x-fake-tool-turns", "two"),
    ],
)
def test_bad_knobs_are_refused(name: str, value: str) -> None:
    with pytest.raises(KnobError, match=name):
        read_knobs({name: value}, {})
    r = reply("chat", request("chat"), {name: value})
    assert r.status == 400
    assert name in json_of(r)["error"]["message"]


def test_every_named_scenario_is_accepted() -> None:
    for scenario in SCENARIOS:
        assert read_knobs({"x-fake-scenario": scenario}, {}).scenario == scenario
