"""The payload budget: sizes from the command line, and which blobs fit."""

from __future__ import annotations

import pytest

from rollcap.report._budget import Budget, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("1234", 1234),
        ("500KB", 500_000),
        ("500kb", 500_000),
        ("64MiB", 64 * 1024**2),
        ("1.5G", 1_500_000_000),
        (" 2 KiB ", 2048),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "12 parsecs", "1iB", "MiB"])
def test_parse_size_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_blobs_are_placed_while_they_fit() -> None:
    budget = Budget(10)
    assert budget.take(("payloads", "a"), 6)
    assert not budget.take(("payloads", "b"), 5)
    assert budget.take(("payloads", "c"), 4)
    assert (budget.left, budget.left_out) == (0, 1)


def test_payloads_push_out_raw_texts_most_recent_first() -> None:
    budget = Budget(10)
    assert budget.take(("raw", "a"), 3, optional=True)
    assert budget.take(("raw", "b"), 3, optional=True)
    assert budget.take(("payloads", "c"), 6)
    assert budget.evicted() == [("raw", "b")]
    assert budget.evicted() == []
    assert (budget.left, budget.left_out) == (1, 1)


def test_nothing_is_pushed_out_for_a_blob_that_would_not_fit_anyway() -> None:
    budget = Budget(10)
    assert budget.take(("raw", "a"), 3, optional=True)
    assert not budget.take(("payloads", "b"), 11)
    assert budget.evicted() == []
    assert budget.left == 7


def test_a_budget_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        Budget(-1)
