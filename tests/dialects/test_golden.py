"""Golden streams for every dialect, reassembled whole, split at every byte, and byte by byte.

Each ``tests/fixtures/<dialect>/<case>.sse`` holds the exact bytes of one stream, and
``<case>.expected.json`` what reassembling it must give: ``outcome``, ``error``, ``response``
and, optionally, ``normalized`` (``normalize`` applied to the reassembled response).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from rollcap.dialects import DIALECT_NAMES, Reassembly, get_dialect, reassemble

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _cases() -> list[Any]:
    cases = []
    for dialect in DIALECT_NAMES:
        for sse in sorted((FIXTURES / dialect).glob("*.sse")):
            cases.append(pytest.param(dialect, sse, id=f"{dialect}/{sse.stem}"))
    return cases


CASES = _cases()


def _expected(sse: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(sse.with_suffix(".expected.json").read_bytes())
    return data


def _check(dialect: str, got: Reassembly, expected: dict[str, Any]) -> None:
    assert got.outcome.value == expected["outcome"]
    assert got.error == expected.get("error")
    assert got.response == expected["response"]
    if "normalized" in expected:
        assert got.response is not None
        normalized = get_dialect(dialect).normalize(got.response)
        assert orjson.loads(orjson.dumps(dataclasses.asdict(normalized))) == expected["normalized"]


def test_every_dialect_has_golden_streams() -> None:
    for dialect in DIALECT_NAMES:
        assert len(list((FIXTURES / dialect).glob("*.sse"))) >= 6, dialect


@pytest.mark.parametrize(("dialect", "sse"), CASES)
def test_golden_whole(dialect: str, sse: Path) -> None:
    _check(dialect, reassemble(dialect, [sse.read_bytes()]), _expected(sse))


@pytest.mark.parametrize(("dialect", "sse"), CASES)
def test_golden_split_at_every_byte(dialect: str, sse: Path) -> None:
    raw = sse.read_bytes()
    expected = _expected(sse)
    whole = reassemble(dialect, [raw])
    for cut in range(1, len(raw)):
        assert reassemble(dialect, [raw[:cut], raw[cut:]]) == whole, cut
    _check(dialect, whole, expected)


@pytest.mark.parametrize(("dialect", "sse"), CASES)
def test_golden_byte_by_byte(dialect: str, sse: Path) -> None:
    raw = sse.read_bytes()
    chunks = [raw[i : i + 1] for i in range(len(raw))]
    _check(dialect, reassemble(dialect, chunks), _expected(sse))


@pytest.mark.parametrize(("dialect", "sse"), CASES)
def test_terminal_event_is_detected_only_in_complete_streams(dialect: str, sse: Path) -> None:
    from rollcap.sse import SSEDecoder

    decoder = SSEDecoder()
    events = decoder.feed(sse.read_bytes()) + decoder.flush(dispatch_unterminated=True)
    is_terminal = get_dialect(dialect).is_terminal_event
    terminal = [e for e in events if is_terminal(e)]
    if _expected(sse)["outcome"] == "truncated":
        assert terminal == []
    else:
        assert terminal
