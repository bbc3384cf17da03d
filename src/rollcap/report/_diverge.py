"""Where two rollouts of one task part, and what first differs (pure).

Rollouts are aligned by conversation, not by call index: a call that failed and was retried
with the same request (the next call's request is the same, ``CanonicalCall.signature``) is a
*retry*, left out of the alignment and named. The aligned calls are compared in order; at the
first pair whose requests differ, what differs is named:

- ``message``: the first message (in canonical form: ids and key order do not count) that differs,
  its index and each side's role; when it is an assistant message after the previous call's
  request, the previous call answered differently (``answered_at``);
- ``params``: the messages are the same and these request fields differ (``stream``,
  ``temperature`` ...), each side's value;
- ``request``: a request that could not be read as a conversation differs;
- ``ended``: one rollout made no further call;
- ``answer``: every request was the same and the last calls answered differently.

Same requests and the same last answer: no divergence (``None``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rollcap.report._delta import CanonicalCall

__all__ = [
    "PAIR_ROWS",
    "VALUE_MAX",
    "CallShape",
    "GroupPairs",
    "Retry",
    "align",
    "divergence",
    "divergence_at",
    "explain",
    "shape_calls",
]

# Every pair among a group's first PAIR_ROWS rollouts is explained; the later ones' with the first.
PAIR_ROWS = 16
VALUE_MAX = 200


@dataclass(frozen=True, slots=True)
class CallShape:
    """What comparing one call across rollouts needs of it."""

    position: int
    signature: bytes
    prints: Sequence[bytes]
    # The canonical messages (shared, not copied): only the differing one's role is ever read.
    messages: Sequence[Any]
    answer: bytes | None
    params: Mapping[str, Any]
    readable: bool
    failed: bool
    error: str | None = None
    status: int | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A failed call and the call that sent the same request again."""

    failed: int
    retry: int
    error: str | None
    status: int | None

    def to_list(self) -> list[Any]:
        return [self.failed, self.retry, self.error, self.status]


def shape_calls(
    calls: Sequence[CanonicalCall], outcomes: Sequence[tuple[str | None, int | None]]
) -> list[CallShape]:
    """Each call's shape; ``outcomes`` are the calls' (error category, HTTP status)."""
    out: list[CallShape] = []
    for position, (call, (error, status)) in enumerate(zip(calls, outcomes, strict=True)):
        out.append(
            CallShape(
                position=position,
                signature=call.signature,
                prints=call.request_fingerprints,
                messages=call.messages or (),
                answer=call.answer_fingerprints[-1] if call.answer_fingerprints else None,
                params=call.params,
                readable=call.request_error is None,
                failed=error is not None or (status or 0) >= 400,
                error=error,
                status=status,
            )
        )
    return out


def align(shapes: Sequence[CallShape]) -> tuple[list[CallShape], list[Retry]]:
    """The calls that count for the alignment, and the retries left out of it."""
    kept: list[CallShape] = []
    retries: list[Retry] = []
    for index, shape in enumerate(shapes):
        following = shapes[index + 1] if index + 1 < len(shapes) else None
        if shape.failed and following is not None and following.signature == shape.signature:
            retries.append(Retry(shape.position, following.position, shape.error, shape.status))
        else:
            kept.append(shape)
    return kept, retries


def divergence(a: Sequence[bytes], b: Sequence[bytes]) -> int | None:
    """The first index whose request signatures differ (the shorter one's length when one
    stopped early); ``None`` when both made the same requests."""
    for index, (left, right) in enumerate(zip(a, b, strict=False)):
        if left != right:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_at(a: Sequence[CallShape], b: Sequence[CallShape]) -> int | None:
    """``divergence`` of two rollouts' aligned calls."""
    return divergence([s.signature for s in a], [s.signature for s in b])


def _value(params: Mapping[str, Any], key: str) -> Any:
    if key not in params:
        return None
    text = orjson.dumps(params[key], option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= VALUE_MAX else text[:VALUE_MAX] + "…"


def _first_difference(left: Sequence[bytes], right: Sequence[bytes]) -> int | None:
    for index, (x, y) in enumerate(zip(left, right, strict=False)):
        if x != y:
            return index
    return None if len(left) == len(right) else min(len(left), len(right))


def _role(messages: Sequence[Any], index: int) -> str | None:
    if index >= len(messages):
        return None
    message = messages[index]
    return str(message.get("role", "?")) if isinstance(message, Mapping) else "?"


def explain(a: Sequence[CallShape], b: Sequence[CallShape]) -> dict[str, Any] | None:
    """What first differs between two rollouts' calls (the module doc), or ``None``."""
    kept_a, retries_a = align(a)
    kept_b, retries_b = align(b)
    out: dict[str, Any] = {
        "retries": {
            "a": [r.to_list() for r in retries_a],
            "b": [r.to_list() for r in retries_b],
        }
    }
    step = divergence_at(kept_a, kept_b)
    if step is None:
        if not kept_a or kept_a[-1].answer == kept_b[-1].answer:
            return None
        out.update(
            kind="answer", step=len(kept_a) - 1, a=kept_a[-1].position, b=kept_b[-1].position
        )
        return out
    left = kept_a[step] if step < len(kept_a) else None
    right = kept_b[step] if step < len(kept_b) else None
    out.update(
        step=step,
        a=None if left is None else left.position,
        b=None if right is None else right.position,
    )
    if left is None or right is None:
        out.update(kind="ended", ended="a" if left is None else "b")
        return out
    if not (left.readable and right.readable):
        out.update(kind="request")
        return out
    index = _first_difference(left.prints, right.prints)
    if index is not None:
        role_a, role_b = _role(left.messages, index), _role(right.messages, index)
        out.update(kind="message", message=index, role_a=role_a, role_b=role_b)
        if step > 0 and "assistant" in (role_a, role_b):
            before_a, before_b = kept_a[step - 1], kept_b[step - 1]
            if index >= len(before_a.prints) and before_a.answer != before_b.answer:
                out["answered_at"] = [before_a.position, before_b.position]
        return out
    keys = sorted(
        key
        for key in {*left.params, *right.params}
        if _value(left.params, key) != _value(right.params, key)
        or (key in left.params) != (key in right.params)
    )
    out.update(
        kind="params",
        params={key: [_value(left.params, key), _value(right.params, key)] for key in keys},
    )
    return out


class GroupPairs:
    """The explained pairs ``"i-j"`` (``i < j``) of one task group, its rollouts given one at a
    time: every pair among the first ``PAIR_ROWS`` rollouts, and the first rollout's with each
    later one. Only the first ``PAIR_ROWS`` rollouts' shapes are kept."""

    def __init__(self) -> None:
        self.pairs: dict[str, dict[str, Any] | None] = {}
        self._kept: list[Sequence[CallShape]] = []
        self._count = 0

    def add(self, shapes: Sequence[CallShape]) -> None:
        j = self._count
        earlier = self._kept if j < PAIR_ROWS else self._kept[:1]
        for i, other in enumerate(earlier):
            self.pairs[f"{i}-{j}"] = explain(other, shapes)
        if j < PAIR_ROWS:
            self._kept.append(shapes)
        self._count += 1
