from __future__ import annotations

from typing import Any

import pytest

from rollcap.conversation import ConversationIndex, answer_fingerprint, fingerprints

SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "weather in Paris?"}
CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "crm__lookup", "arguments": '{"city": "Paris", "days": 2}'},
        }
    ],
}
ARGS = '{"city":"Paris","days":2}'
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_a_follow_up_finds_the_call_whose_answer_it_continues() -> None:
    index = ConversationIndex()
    first = fingerprints([SYSTEM, USER])
    assert index.parent("r", first) is None
    index.remember("r", answer_fingerprint(first, CALL), "a" * 32)
    second = fingerprints([SYSTEM, USER, CALL, RESULT])
    assert index.parent("r", second) == "a" * 32
    # Another rollout with the same conversation is not this chain.
    assert index.parent("other", second) is None


def test_the_longest_matching_conversation_wins() -> None:
    index = ConversationIndex()
    first = fingerprints([USER])
    index.remember("r", answer_fingerprint(first, CALL), "a" * 32)
    second = fingerprints([USER, CALL, RESULT])
    answer = {"role": "assistant", "content": "It is sunny."}
    index.remember("r", answer_fingerprint(second, answer), "b" * 32)
    third = fingerprints([USER, CALL, RESULT, answer, {"role": "user", "content": "and Rome?"}])
    assert index.parent("r", third) == "b" * 32


@pytest.mark.parametrize(
    "sent_back",
    [
        # Ids and empty content are free to change; JSON arguments compare by value.
        {**CALL, "content": ""},
        {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "call_other"}]},
        {
            **CALL,
            "tool_calls": [
                {
                    "id": "x",
                    "type": "function",
                    "function": {"name": "crm__lookup", "arguments": '{"days":2,"city":"Paris"}'},
                }
            ],
        },
        {**CALL, "content": [{"type": "text", "text": ""}]},
    ],
)
def test_what_clients_and_translations_may_change_does_not_break_the_chain(
    sent_back: dict[str, Any],
) -> None:
    index = ConversationIndex()
    index.remember("r", answer_fingerprint(fingerprints([USER]), CALL), "a" * 32)
    assert index.parent("r", fingerprints([USER, sent_back, RESULT])) == "a" * 32


@pytest.mark.parametrize(
    "changed",
    [
        {**CALL, "content": "extra words"},
        {
            **CALL,
            "tool_calls": [
                {"id": "x", "function": {"name": "crm__lookup", "arguments": '{"city":"Rome"}'}}
            ],
        },
        {
            **CALL,
            "tool_calls": [
                {
                    "id": "x",
                    "function": {"name": "lookup", "arguments": '{"city":"Paris","days":2}'},
                }
            ],
        },
    ],
)
def test_a_different_answer_is_not_a_continuation(changed: dict[str, Any]) -> None:
    index = ConversationIndex()
    index.remember("r", answer_fingerprint(fingerprints([USER]), CALL), "a" * 32)
    assert index.parent("r", fingerprints([USER, changed, RESULT])) is None


def test_a_namespaced_tool_has_one_identity_in_either_form() -> None:
    identities = {"crm__lookup": ("crm", "lookup")}
    flat = fingerprints([USER, CALL], identities)
    # The same call under a chat name that some other translation chose for crm/lookup.
    renamed = {
        **CALL,
        "tool_calls": [
            {
                "id": "x",
                "function": {"name": "crm.lookup", "arguments": '{"city":"Paris","days":2}'},
            }
        ],
    }
    assert fingerprints([USER, renamed], {"crm.lookup": ("crm", "lookup")}) == flat
    # Without the namespace the identity differs: a plain tool named lookup is another tool.
    plain = {
        **CALL,
        "tool_calls": [{"id": "x", "function": {"name": "lookup", "arguments": ARGS}}],
    }
    assert fingerprints([USER, plain])[-1] != flat[-1]


def test_the_index_keeps_only_the_most_recent_rollouts() -> None:
    index = ConversationIndex(max_rollouts=2)
    prints = fingerprints([USER])
    done = answer_fingerprint(prints, CALL)
    for rollout in ("r1", "r2", "r3"):
        index.remember(rollout, done, "a" * 32)
    follow_up = fingerprints([USER, CALL, RESULT])
    assert index.parent("r1", follow_up) is None
    assert index.parent("r3", follow_up) == "a" * 32
    index.forget("r3")
    assert index.parent("r3", follow_up) is None
    with pytest.raises(ValueError, match="max_rollouts"):
        ConversationIndex(max_rollouts=0)
