"""Our reassembly against the official SDKs' own stream accumulation, over a corpus of streams.

For each stream of ``_corpus`` (generated ones with unknown keys at every level, and every
scenario of the fake upstream), the reassembled response must equal, as JSON, what the SDK builds
from the same bytes (``_sdk``), for every key the stream carries:

- a key the SDK holds with a value: ours holds the same value;
- a key the SDK holds as null or not at all: ours may hold a value only for a key the stream
  names (kept where the SDK drops it, as each dialect's docstring says);
- null and absent are the same (the SDKs fill unset fields with null);
- a chat choice's own list or string key may go on past the SDK's (which keeps the first
  chunk's alone);
- keys the SDK computes itself (structured-output parsing) are not compared.

And every unknown ``x_probe_*`` key the stream sent is in the reassembly. Streams the SDK cannot
finish (an error event, a Responses stream without ``response.completed``) have no reference and
are left to the golden tests.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest

from rollcap.dialects import reassemble
from tests.dialects._corpus import PROBE_PREFIX, Stream, corpus
from tests.dialects._sdk import DERIVED_KEYS, NoReference, sdk_final

CORPUS = corpus()


def differences(sdk: Any, ours: Any, raw: str, stream: Stream, path: str = "$") -> list[str]:
    """Where ``ours`` departs from ``sdk`` beyond what the module docstring allows."""
    if isinstance(sdk, dict) and isinstance(ours, dict):
        found = []
        for key in sorted(set(sdk) | set(ours)):
            if key in DERIVED_KEYS:
                continue
            theirs, mine = sdk.get(key), ours.get(key)
            where = f"{path}.{key}"
            if theirs is None:
                if mine is not None and f'"{key}"' not in raw:
                    found.append(f"{where}: ours has {mine!r:.60}, a key the stream never named")
            elif mine is None:
                found.append(f"{where}: missing, the SDK has {theirs!r:.60}")
            else:
                found += differences(theirs, mine, raw, stream, where)
        return found
    if _kept_beyond_first_chunk(sdk, ours, path):
        return []
    if isinstance(sdk, list) and isinstance(ours, list):
        if len(sdk) != len(ours):
            return [f"{path}: {len(ours)} entries, the SDK has {len(sdk)}"]
        return [
            found
            for index, (theirs, mine) in enumerate(zip(sdk, ours, strict=True))
            for found in differences(theirs, mine, raw, stream, f"{path}[{index}]")
        ]
    if sdk != ours:
        if stream.cut and path.endswith(".input") and isinstance(ours, str):
            # A tool input cut mid-JSON: the SDK keeps what parses and drops the cut piece;
            # ours keeps the text (messages docstring).
            return []
        return [f"{path}: ours {ours!r:.60}, the SDK {sdk!r:.60}"]
    return []


def _kept_beyond_first_chunk(sdk: Any, ours: Any, path: str) -> bool:
    """A chat choice's own key (vLLM's ``token_ids``): the SDK keeps the first chunk's value,
    ours goes on with every later chunk's (chat docstring), so it starts with the SDK's."""
    if not re.fullmatch(r"\$\.choices\[\d+\]\.[A-Za-z_]+", path) or path.endswith(".index"):
        return False
    both = (list, list) if isinstance(sdk, list) else (str, str)
    return (
        isinstance(sdk, both[0])
        and isinstance(ours, both[1])
        and len(ours) > len(sdk)
        and ours[: len(sdk)] == sdk
    )


def probes(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {k for k in value if k.startswith(PROBE_PREFIX)} | {
            p for v in value.values() for p in probes(v)
        }
    if isinstance(value, list):
        return {p for v in value for p in probes(v)}
    return set()


def _sent_probes(stream: Stream) -> set[str]:
    sent = set()
    for line in stream.raw.split(b"\n"):
        if line.startswith(b"data: {"):
            sent |= probes(orjson.loads(line[6:]))
    return sent


def _compare(stream: Stream) -> tuple[list[str], set[str]] | None:
    try:
        reference = sdk_final(stream.dialect, stream.raw)
    except NoReference:
        return None
    ours = reassemble(stream.dialect, [stream.raw])
    assert ours.response is not None
    missing = _sent_probes(stream) - probes(ours.response)
    return differences(reference, ours.response, stream.raw.decode(), stream), missing


def test_the_corpus_covers_every_dialect_and_what_the_issue_lists() -> None:
    compared = [s for s in CORPUS if _compare(s) is not None]
    by_dialect = {
        d: sum(1 for s in compared if s.dialect == d) for d in ("chat", "messages", "responses")
    }
    assert all(count >= 100 for count in by_dialect.values()), by_dialect
    raw = b"".join(s.raw for s in compared)
    for needle in (
        b"context_management",
        b'"refusal"',
        b"reasoning_content",
        b"thinking_delta",
        b"citations_delta",
        b"input_json_delta",
        b'"tool_calls"',
        b"function_call_arguments.delta",
        b'"index":1,"delta"',  # a second choice
        b"x_probe_message_delta_top",
        b"x_probe_delta",
        b"x_probe_usage_detail",
        b"x_probe_block",
        b'"token_ids"',
    ):
        assert needle in raw, needle


@pytest.mark.parametrize("stream", CORPUS, ids=lambda s: s.name)
def test_reassembly_equals_the_sdks_accumulation(stream: Stream) -> None:
    compared = _compare(stream)
    if compared is None:
        assert stream.cut or stream.dialect != "chat", "the SDK finishes every chat stream"
        return
    found, missing = compared
    assert found == []
    assert missing == set()


def test_the_comparison_fails_when_a_top_level_message_delta_key_is_dropped() -> None:
    stream = next(s for s in CORPUS if b'"context_management"' in s.raw and not s.cut)
    reference = sdk_final("messages", stream.raw)
    ours = reassemble("messages", [stream.raw]).response
    assert ours is not None
    dropped = {k: v for k, v in ours.items() if k != "context_management"}
    assert any("context_management" in d for d in differences(reference, dropped, "", stream))


def test_the_comparison_fails_when_an_unknown_key_inside_a_delta_is_dropped() -> None:
    stream = next(s for s in CORPUS if s.dialect == "chat" and b'"x_probe_delta"' in s.raw)
    reference = sdk_final("chat", stream.raw)
    ours = reassemble("chat", [stream.raw]).response
    assert ours is not None
    for choice in ours["choices"]:
        for key in [k for k in choice["message"] if k.startswith("x_probe_delta")]:
            del choice["message"][key]
    assert any(
        "x_probe_delta" in d for d in differences(reference, ours, stream.raw.decode(), stream)
    )
    # A delta key the SDK itself drops (Messages): the probe check is what catches it.
    stream = next(s for s in CORPUS if s.dialect == "messages" and b'"x_probe_text_delta' in s.raw)
    ours = reassemble("messages", [stream.raw]).response
    assert ours is not None
    for block in ours["content"]:
        for key in [k for k in block if k.startswith("x_probe_text_delta")]:
            del block[key]
    assert _sent_probes(stream) - probes(ours)
