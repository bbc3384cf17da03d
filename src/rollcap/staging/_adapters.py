"""Engine adapters: what to ask the engine for, where its exact token ids are, what to hide.

An adapter is pure: it reads and returns plain JSON-like dicts and never mutates its input. The
capture calls ``extract_*``; the worker around the engine calls ``prepare_request``,
``enter_prefix`` and ``strip``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rollcap.staging._records import (
    CAPTURE_FIELD,
    COORDS_FIELD,
    ExtractionError,
    check_token_ids,
)

__all__ = [
    "INTERNAL_CHOICE_FIELDS",
    "INTERNAL_RESPONSE_FIELDS",
    "MEDIA_SPANS_FIELD",
    "PREFIX_IDS_FIELD",
    "PROMPT_IDS_FIELD",
    "REQUEST_FIELDS",
    "ROUTED_EXPERTS_FIELD",
    "CaptureAdapter",
    "VLLMCaptureAdapter",
]

PROMPT_IDS_FIELD = "prompt_token_ids"
GENERATED_IDS_FIELD = "token_ids"
# The request field an RL vLLM worker reads to force the prompt's first token ids (the ids of
# earlier turns exactly as generated, instead of a re-tokenization of their text).
PREFIX_IDS_FIELD = "required_prefix_token_ids"
ROUTED_EXPERTS_FIELD = "routed_experts"
MEDIA_SPANS_FIELD = "media_spans"
_TOKEN_ID_PREFIX = "token_id:"

REQUEST_FIELDS: Mapping[str, Any] = {
    "return_token_ids": True,
    "logprobs": True,
    "return_tokens_as_token_ids": True,
}

# Fields no ordinary chat completion has: they exist only because capture asked for them.
INTERNAL_RESPONSE_FIELDS = (
    PROMPT_IDS_FIELD,
    "prompt_logprobs",
    ROUTED_EXPERTS_FIELD,
    MEDIA_SPANS_FIELD,
    COORDS_FIELD,
    "kv_transfer_params",
    PREFIX_IDS_FIELD,
)
INTERNAL_CHOICE_FIELDS = (
    GENERATED_IDS_FIELD,
    PROMPT_IDS_FIELD,
    ROUTED_EXPERTS_FIELD,
    MEDIA_SPANS_FIELD,
)
_INTERNAL_MESSAGE_FIELDS = (GENERATED_IDS_FIELD, PROMPT_IDS_FIELD, ROUTED_EXPERTS_FIELD)


class CaptureAdapter(Protocol):
    """What ``RolloutTokenCapture`` needs from an engine adapter.

    Each ``extract_*`` raises ``ExtractionError`` (or any exception) when the response does not
    carry what it should; the capture turns that into ``capture_failed`` coords.
    """

    def extract_prompt_ids(self, response: Mapping[str, Any]) -> list[int]: ...

    def extract_generation(self, response: Mapping[str, Any]) -> tuple[list[int], list[float]]: ...

    def extract_extras(self, response: Mapping[str, Any]) -> dict[str, Any] | None: ...


def _single_choice(response: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(response, Mapping):
        raise ExtractionError(f"response must be a JSON object, not {type(response).__name__}")
    choices = response.get("choices")
    if not isinstance(choices, list):
        raise ExtractionError("response has no choices list")
    if len(choices) != 1:
        # One call stages one continuation; n > 1 would need one staging key per choice.
        raise ExtractionError(f"response has {len(choices)} choices; capture needs exactly one")
    choice = choices[0]
    if not isinstance(choice, Mapping):
        raise ExtractionError("choices[0] is not a JSON object")
    return choice


def _ids(value: object, where: str) -> list[int]:
    try:
        return list(check_token_ids(value, where))
    except ValueError as exc:
        raise ExtractionError(str(exc)) from None


def _id_from_token(token: object, index: int) -> int:
    """Parse ``token_id:N``, the token spelling ``return_tokens_as_token_ids`` asks for."""
    if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
        raise ExtractionError(
            f"logprobs.content[{index}].token is {token!r}, not of the form 'token_id:N'",
        )
    digits = token[len(_TOKEN_ID_PREFIX) :]
    if not digits.isascii() or not digits.isdigit():
        raise ExtractionError(f"logprobs.content[{index}].token {token!r} has no integer id")
    return int(digits)


class VLLMCaptureAdapter:
    """Adapter for vLLM's OpenAI-compatible chat completions (non-streamed).

    Reads the prompt ids from the top-level ``prompt_token_ids``, the generated ids from
    ``choices[0].token_ids`` (else from ``logprobs.content[i].token`` spelled ``token_id:N``)
    and their logprobs from ``logprobs.content[i].logprob``. Ids are the expanded sequence the
    engine saw and produced; ``routed_experts`` and ``media_spans`` are kept as extras.
    """

    @property
    def request_fields(self) -> dict[str, Any]:
        return dict(REQUEST_FIELDS)

    def prepare_request(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``body`` that asks for token ids and logprobs, without ``ng_capture``."""
        prepared = {k: v for k, v in body.items() if k != CAPTURE_FIELD}
        prepared.update(REQUEST_FIELDS)
        return prepared

    def enter_prefix(self, body: Mapping[str, Any], prefix_ids: Sequence[int]) -> dict[str, Any]:
        """A copy of ``body`` that pins the prompt's first ids (``PREFIX_IDS_FIELD``)."""
        ids = check_token_ids(prefix_ids, "prefix_ids")
        pinned = dict(body)
        pinned[PREFIX_IDS_FIELD] = list(ids)
        return pinned

    def extract_prompt_ids(self, response: Mapping[str, Any]) -> list[int]:
        _single_choice(response)
        if PROMPT_IDS_FIELD not in response:
            raise ExtractionError(
                f"response has no {PROMPT_IDS_FIELD} (was the request sent with "
                "return_token_ids: true?)",
            )
        return _ids(response[PROMPT_IDS_FIELD], PROMPT_IDS_FIELD)

    def extract_generation(self, response: Mapping[str, Any]) -> tuple[list[int], list[float]]:
        choice = _single_choice(response)
        content = self._logprob_content(choice)
        logprobs: list[float] = []
        for index, entry in enumerate(content):
            if not isinstance(entry, Mapping):
                raise ExtractionError(f"logprobs.content[{index}] is not a JSON object")
            value = entry.get("logprob")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ExtractionError(f"logprobs.content[{index}].logprob is {value!r}")
            if not math.isfinite(value):
                raise ExtractionError(f"logprobs.content[{index}].logprob is not finite")
            logprobs.append(float(value))
        raw_ids = choice.get(GENERATED_IDS_FIELD)
        if raw_ids is not None:
            ids = _ids(raw_ids, f"choices[0].{GENERATED_IDS_FIELD}")
            if len(ids) != len(logprobs):
                raise ExtractionError(
                    f"choices[0].token_ids has {len(ids)} ids but logprobs.content has "
                    f"{len(logprobs)} entries",
                )
            for index, (token_id, entry) in enumerate(zip(ids, content, strict=True)):
                token = entry.get("token")
                # Where the entry also spells its id, the two must agree: they are two reports
                # of one token, and a disagreement means one of them is not what was sampled.
                if (
                    isinstance(token, str)
                    and token.startswith(_TOKEN_ID_PREFIX)
                    and _id_from_token(token, index) != token_id
                ):
                    raise ExtractionError(
                        f"choices[0].token_ids[{index}] is {token_id} but "
                        f"logprobs.content[{index}].token is {token!r}",
                    )
            return ids, logprobs
        ids = [_id_from_token(entry.get("token"), i) for i, entry in enumerate(content)]
        return _ids(ids, "logprobs.content token ids"), logprobs

    @staticmethod
    def _logprob_content(choice: Mapping[str, Any]) -> list[Any]:
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, Mapping):
            raise ExtractionError(
                "choices[0].logprobs is missing (was the request sent with logprobs: true?)",
            )
        content = logprobs.get("content")
        if content is None:
            content = []
        if not isinstance(content, list):
            raise ExtractionError("choices[0].logprobs.content is not a list")
        return content

    def extract_extras(self, response: Mapping[str, Any]) -> dict[str, Any] | None:
        """``routed_experts`` and ``media_spans`` when present (choice level wins), else None."""
        choice = _single_choice(response)
        extras: dict[str, Any] = {}
        for name in (ROUTED_EXPERTS_FIELD, MEDIA_SPANS_FIELD):
            if choice.get(name) is not None:
                extras[name] = choice[name]
            elif response.get(name) is not None:
                extras[name] = response[name]
        return extras or None

    def strip(self, response: Mapping[str, Any], *, keep_logprobs: bool = False) -> dict[str, Any]:
        """A copy of ``response`` without the fields capture added, for the client.

        ``keep_logprobs`` is whether the client itself asked for logprobs; without it each
        choice's ``logprobs`` becomes ``null`` as in any completion that did not ask. (Token
        strings in kept logprobs stay in the ``token_id:N`` spelling capture asked for.)
        """
        stripped = {
            k: copy.deepcopy(v) for k, v in response.items() if k not in INTERNAL_RESPONSE_FIELDS
        }
        choices = stripped.get("choices")
        if isinstance(choices, list):
            stripped["choices"] = [self._strip_choice(c, keep_logprobs) for c in choices]
        return stripped

    @staticmethod
    def _strip_choice(choice: object, keep_logprobs: bool) -> object:
        if not isinstance(choice, dict):
            return choice
        clean = {k: v for k, v in choice.items() if k not in INTERNAL_CHOICE_FIELDS}
        if not keep_logprobs and "logprobs" in clean:
            clean["logprobs"] = None
        message = clean.get("message")
        if isinstance(message, dict):
            clean["message"] = {
                k: v for k, v in message.items() if k not in _INTERNAL_MESSAGE_FIELDS
            }
        return clean
