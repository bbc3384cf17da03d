"""Claude Code only: find the hidden call that wrote a compaction's summary (pure).

Claude Code compacts a long conversation by asking the model for a summary in a call of its
own, which its transcript never names. ``associate_compaction_calls(bundle, calls)`` looks,
for each completed compaction that has a summary and no ``model_calls``, for the one captured
call that can only be that summary call:

- no invocation's ref names it, and it is an Anthropic Messages call that succeeded (2xx, no
  error category) and has a key to be named by;
- it is on the model server of the compaction's before/after calls, when those name one;
- its request's last message is the user's, carrying Claude Code's compaction prompt;
- its text answer, normalized as Claude Code does before it persists a summary, is the
  persisted summary, up to the fixed sentences Claude Code appends;
- it lies strictly between the before and after calls by ``call_index``, when those are set.

A unique match becomes the compaction's ``model_calls`` and joins the invocation's refs just
after the before call (or before the after call); several candidates for one compaction, or
one candidate that two compactions share, give ``compaction_model_call_match_ambiguous``
with ``candidate_count=N``. A resolved compaction no longer needs the producer's
``compaction_model_call_reference_unavailable`` gap for its invocation.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

from rollcap.evidence._codes import GAP_COMPACTION_MATCH_AMBIGUOUS
from rollcap.evidence._models import (
    AgentInvocation,
    AgentObservationBundle,
    ContextCompactionObservation,
    ModelCallRef,
    server_ref_key,
)
from rollcap.records import Gap, ModelCallRecord

__all__ = ["CLAUDE_CODE_SOURCE", "associate_compaction_calls"]

CLAUDE_CODE_SOURCE = "claude_code"
_REFERENCE_UNAVAILABLE = "compaction_model_call_reference_unavailable"

# Claude Code's compaction prompts open with one of these sentences.
_PROMPT_MARKERS = (
    "Your task is to create a detailed summary of this conversation.",
    "Your task is to create a detailed summary of the conversation so far",
    "Your task is to create a detailed summary of the RECENT portion of the conversation",
)
# What Claude Code writes before the summary it persists...
_SUMMARY_PREFIX = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The summary below covers the earlier portion of the conversation.\n\n"
)
# ...and the sentences it may write after it, each optional, in this order.
_SUMMARY_SUFFIX = re.compile(
    r"(?:\n\nIf you need specific details from before compaction "
    r"\(like exact code snippets, error messages, or content you generated\), "
    r"read the full transcript at: [^\n]+)?"
    r"(?:\n\nRecent messages are preserved verbatim\.)?"
    r"(?:\n\nYour REPL VM state has been cleared as part of this compaction\. "
    r"Variables defined in REPL calls before this point are no longer accessible "
    r"\u2014 redefine any you still need\.)?"
    r"(?:\n\nContinue the conversation from where it left off without asking the user "
    r"any further questions\. Resume directly \u2014 do not acknowledge the summary, "
    r"do not recap what was happening, do not preface with \"I'll continue\" or similar\. "
    r"Pick up the last task as if the break never happened\.)?"
)
_ANALYSIS = re.compile(r"<analysis>[\s\S]*?</analysis>")
_SUMMARY = re.compile(r"<summary>([\s\S]*?)</summary>")
_BLANK_RUNS = re.compile(r"\n\n+")


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(block, dict) and block.get("type") == "text" for block in content
    ):
        return "".join(str(block.get("text") or "") for block in content)
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _is_compaction_prompt(request: object) -> bool:
    if not isinstance(request, dict):
        return False
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return False
    text = _content_text(last.get("content"))
    return any(marker in text for marker in _PROMPT_MARKERS)


def _answer_text(response: object) -> str | None:
    if not isinstance(response, dict) or not isinstance(response.get("content"), list):
        return None
    texts = [
        block["text"]
        for block in response["content"]
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ]
    return "".join(texts) or None


def _as_persisted(answer: str) -> str:
    """The summary Claude Code persists for a model's answer: no analysis, a titled summary."""
    text = _ANALYSIS.sub("", answer, count=1)
    found = _SUMMARY.search(text)
    if found is not None:
        text = f"{text[: found.start()]}Summary:\n{found.group(1).strip()}{text[found.end() :]}"
    return _BLANK_RUNS.sub("\n\n", text).strip()


def _summary_matches(summary: str, answer: str) -> bool:
    expected = _SUMMARY_PREFIX + _as_persisted(answer)
    return (
        summary.startswith(expected)
        and _SUMMARY_SUFFIX.fullmatch(summary[len(expected) :]) is not None
    )


def _names(ref: ModelCallRef, call: ModelCallRecord) -> bool:
    if ref.model_call_id:
        return ref.model_call_id == call.model_call_id
    server = None if ref.model_ref is None else (ref.model_ref.type, ref.model_ref.name)
    return server == server_ref_key(call.model_ref) and ref.response_id == call.response_id


def _only_index(ref: ModelCallRef | None, calls: Sequence[ModelCallRecord]) -> int | None:
    if ref is None:
        return None
    found = [call.call_index for call in calls if _names(ref, call)]
    return found[0] if len(found) == 1 else None


def _candidates(
    compaction: ContextCompactionObservation,
    calls: Sequence[ModelCallRecord],
    owned: set[int],
) -> list[int]:
    summary = compaction.summary
    if compaction.outcome != "completed" or compaction.model_calls or summary is None:
        return []
    before, after = compaction.before_model_call, compaction.after_model_call
    before_index, after_index = _only_index(before, calls), _only_index(after, calls)
    if (before is not None and before_index is None) or (after is not None and after_index is None):
        return []
    servers = [
        (ref.model_ref.type, ref.model_ref.name)
        for ref in (before, after)
        if ref is not None and ref.model_ref is not None
    ]
    found = []
    for position, call in enumerate(calls):
        status = call.status_code
        answer = _answer_text(call.response)
        if (
            position in owned
            or call.dialect != "messages"
            or status is None
            or not 200 <= status < 300
            or call.error_category is not None
            or not (call.model_call_id or (call.model_ref is not None and call.response_id))
            or (servers and server_ref_key(call.model_ref) not in servers)
            or not _is_compaction_prompt(call.request)
            or answer is None
            or not _summary_matches(summary, answer)
            or (before_index is not None and call.call_index <= before_index)
            or (after_index is not None and call.call_index >= after_index)
        ):
            continue
        found.append(position)
    return found


def _insert_at(invocation: AgentInvocation, compaction: ContextCompactionObservation) -> int:
    """Just after the before call, or just before the after call, else at the end."""
    at = len(invocation.model_calls)
    for position, existing in enumerate(invocation.model_calls):
        if compaction.after_model_call is not None and existing == compaction.after_model_call:
            return position
        if compaction.before_model_call is not None and existing == compaction.before_model_call:
            at = position + 1
    return at


def associate_compaction_calls(
    bundle: AgentObservationBundle, calls: Sequence[ModelCallRecord]
) -> AgentObservationBundle:
    """``bundle`` with each compaction's summary call found where it is unique (see module)."""
    if bundle.source != CLAUDE_CODE_SOURCE:
        return bundle
    result = bundle.model_copy(deep=True)
    invocations = {inv.invocation_id: inv for inv in result.invocations()}
    compactions = [r for r in result.records if isinstance(r, ContextCompactionObservation)]
    owned = {
        position
        for invocation in invocations.values()
        for ref in invocation.model_calls
        for position, call in enumerate(calls)
        if _names(ref, call)
    }
    found = [_candidates(compaction, calls, owned) for compaction in compactions]
    shared = Counter(position for positions in found for position in positions)
    gaps = list(result.gaps)
    for compaction, positions in zip(compactions, found, strict=True):
        unique = len(positions) == 1 and shared[positions[0]] == 1
        if positions and not unique:
            gaps.append(
                Gap(
                    GAP_COMPACTION_MATCH_AMBIGUOUS,
                    f"candidate_count={len(positions)}",
                    compaction.invocation_id,
                )
            )
        invocation = invocations.get(compaction.invocation_id)
        if not unique or invocation is None:
            continue
        call = calls[positions[0]]
        ref = ModelCallRef.model_validate(
            {
                "model_call_id": call.model_call_id,
                "model_ref": call.model_ref,
                "response_id": call.response_id,
            }
        )
        compaction.model_calls = [ref]
        refs = list(invocation.model_calls)
        refs.insert(_insert_at(invocation, compaction), ref)
        invocation.model_calls = refs
    unresolved = {c.invocation_id for c in compactions if not c.model_calls}
    result.gaps = [
        gap for gap in gaps if gap.code != _REFERENCE_UNAVAILABLE or gap.invocation_id in unresolved
    ]
    return result
