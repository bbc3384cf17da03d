"""Engine adapters and the engine request / answer transport fields of external staging.

Three parties touch an engine call. The gate builds the engine request (``prepare_engine_request``:
the admission and what the worker's engine must be asked for) and strips the token transport
fields from the worker's answer before the client sees it (``strip_capture_transport_fields``).
The worker hands the resolved prefix ids to its engine (``CaptureAdapter.enter_prefix``) and the
capture reads the engine's exact ids, logprobs and extras back out of its answer
(``extract_prompt_ids``, ``extract_generation``, ``extract_extras``).

Everything here is pure: it reads plain JSON-like values (or, for Megatron, an object with
attributes) and never mutates its input, except ``enter_prefix``, which by contract sets the
prefix field on the request it is given. Each ``extract_*`` raises ``ValueError`` or
``TypeError`` naming the path of the offending value (e.g.
``choices[0].logprobs.content[3].token``); the capture turns any exception into
``capture_failed`` coords.

This module imports only the standard library: the rest of ``rollcap.staging`` may depend on it,
never the reverse.
"""

from __future__ import annotations

import copy
import math
import re
from array import array
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeVar

# The admission rides on the engine request (vLLM worker: top level; Megatron: offload_params);
# the worker's coords are a top-level member of its chat-completion answer.
from rollcap.staging._records import CAPTURE_FIELD, COORDS_FIELD

__all__ = [
    "BACKENDS",
    "MEDIA_SPANS_FIELD",
    "PREFIX_IDS_FIELD",
    "ROUTED_EXPERTS_FIELD",
    "STREAMING_REFUSED",
    "TRANSPORT_ANSWER_FIELDS",
    "TRANSPORT_CHOICE_FIELDS",
    "TRANSPORT_MESSAGE_FIELDS",
    "Backend",
    "CaptureAdapter",
    "MegatronCaptureAdapter",
    "VLLMCaptureAdapter",
    "prepare_engine_request",
    "strip_capture_transport_fields",
]

# The request field that pins the prompt's first ids to the ids earlier calls actually used.
PREFIX_IDS_FIELD: Final = "required_prefix_token_ids"
ROUTED_EXPERTS_FIELD: Final = "routed_experts"
MEDIA_SPANS_FIELD: Final = "media_spans"

Backend = Literal["vllm_worker", "megatron_worker"]
BACKENDS: Final[tuple[Backend, ...]] = ("vllm_worker", "megatron_worker")
STREAMING_REFUSED: Final = "external staging requires non-streaming backend requests"

# What the gate removes from a worker answer before the client sees it. The top-level
# media_spans is deliberately not listed: the contract keeps it.
TRANSPORT_ANSWER_FIELDS: Final = (COORDS_FIELD, "prompt_token_ids")
TRANSPORT_CHOICE_FIELDS: Final = ("logprobs", "token_ids")
TRANSPORT_MESSAGE_FIELDS: Final = (
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    ROUTED_EXPERTS_FIELD,
    "compact_prompt_token_ids",
)

_PROMPT_IDS: Final = "prompt_token_ids"
_GENERATION_IDS: Final = "generation_token_ids"
_GENERATION_LOGPROBS: Final = "generation_log_probs"
_TOKEN_ID_PREFIX: Final = "token_id:"
# A numeric id string: plain ASCII digits. int() alone would also take "+5", " 5", "5_0" and
# other scripts' digits, none of which an engine writes for an id.
_DIGITS: Final = re.compile(r"[0-9]+")

_Request = TypeVar("_Request", bound=MutableMapping[str, Any])


class CaptureAdapter(Protocol):
    """What ``RolloutTokenCapture`` and its worker need from an engine adapter.

    ``payload`` is the engine's answer in whatever form the adapter knows (a vLLM chat
    completion dict, a Megatron offloaded payload). Each ``extract_*`` raises (any exception)
    when the payload does not carry what it should; the capture then fails the call.
    """

    def enter_prefix(self, request: _Request, prefix_ids: Iterable[int]) -> _Request:
        """Pin ``request``'s prompt to start with ``prefix_ids``: sets ``PREFIX_IDS_FIELD`` in
        place and returns the same request."""
        ...

    def extract_prompt_ids(self, payload: Any) -> list[int]:
        """The exact prompt ids the engine processed (vLLM: expanded multimodal ids)."""
        ...

    def extract_generation(self, payload: Any) -> tuple[list[int], list[float]]:
        """The generated ids and one logprob per id (equal lengths)."""
        ...

    def extract_extras(self, payload: Any) -> dict[str, Any] | None:
        """What the record's ``extras`` should be: None when there is nothing (never ``{}``)."""
        ...


def _enter_prefix(request: _Request, prefix_ids: Iterable[int]) -> _Request:
    if not isinstance(request, MutableMapping):
        raise TypeError(f"request must be a mutable mapping, not {type(request).__name__}")
    ids = list(prefix_ids)
    # Checked before the request is touched: a wrong pin would make the engine continue from
    # tokens that are not the parent's, and a half-updated request is worse than none.
    for index, value in enumerate(ids):
        _exact_id(value, f"prefix_ids[{index}]")
    request[PREFIX_IDS_FIELD] = ids
    return request


def _exact_id(value: object, where: str) -> int:
    """An id that already is an int: never coerced (see ``_json_id`` for why)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{where} is {value}; token ids are >= 0")
    return value


def _json_id(value: object, where: str) -> int:
    """A token id from JSON, "through int()" as vLLM answers allow: an int, or a numeric string.

    A bool (``int(True)`` is 1), a negative number, a non-integral or non-finite float and any
    other string are refused rather than coerced: a coerced id is a different token, and
    training on it trains the policy on a token it never produced, silently. An integral float
    (``7.0``) is the same number and is taken.
    """
    if isinstance(value, bool):
        raise TypeError(f"{where} is a bool, not a token id")
    if isinstance(value, int):
        result = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{where} is {value!r}, not an integral token id")
        result = int(value)
    elif isinstance(value, str):
        if not _DIGITS.fullmatch(value):
            raise ValueError(f"{where} is {value!r}, not a decimal token id")
        result = int(value)
    else:
        raise TypeError(f"{where} must be an int or a numeric string, not {type(value).__name__}")
    if result < 0:
        raise ValueError(f"{where} is {result}; token ids are >= 0")
    return result


def _token_id(value: object, where: str) -> int:
    """A ``logprobs.content[i].token``: ``"token_id:N"``, ``"N"`` or an int N."""
    if isinstance(value, bool):
        raise TypeError(f"{where} is a bool, not a token id")
    # Taken as a string first (an int token reads as its digits), as the contract says; so a
    # float token is refused here rather than truncated.
    text = str(value) if isinstance(value, int) else value
    if not isinstance(text, str):
        raise TypeError(f"{where} must be a string or an int, not {type(value).__name__}")
    digits = text.removeprefix(_TOKEN_ID_PREFIX)
    if not _DIGITS.fullmatch(digits):
        raise ValueError(
            f"{where} is {text!r}, not 'token_id:N' (was the request sent with "
            "return_tokens_as_token_ids: true?)"
        )
    return int(digits)


def _json_logprob(value: object, where: str) -> float:
    """A logprob "through float()": a number or a numeric string; never a bool, always finite."""
    if isinstance(value, bool):
        raise TypeError(f"{where} is a bool, not a logprob")
    if not isinstance(value, int | float | str):
        raise TypeError(f"{where} must be a number, not {_kind(value)}")
    try:
        result = float(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{where} is {value!r}, not a float64 number") from None
    if not math.isfinite(result):
        raise ValueError(f"{where} is {result!r}; logprobs must be finite")
    return result


def _ids_list(value: object, where: str) -> list[int]:
    if not isinstance(value, list):
        raise TypeError(f"{where} must be a list, not {_kind(value)}")
    # The common case, plain ints in range, is checked in C (a prompt is tens of thousands of
    # ids); anything else takes the per-id rule, which also names the culprit.
    if not set(map(type, value)) - {int}:
        try:
            array("Q", value)
        except OverflowError:
            pass
        else:
            return list(value)
    return [_json_id(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _object(payload: object) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise TypeError(f"the engine answer must be a JSON object, not {_kind(payload)}")
    return payload


def _probe_message(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``choices[0].message`` when the answer has one, else None (no shape is required)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, Mapping) else None


def _first_choice(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list):
        raise ValueError(f"choices must be a list, not {_kind(choices)}")
    if not choices:
        raise ValueError("choices is empty")
    choice = choices[0]
    if not isinstance(choice, Mapping):
        raise TypeError(f"choices[0] must be an object, not {_kind(choice)}")
    return choice


def _has_bundle(message: Mapping[str, Any]) -> bool:
    """Whether the message carries the generation half of the message-level token bundle."""
    return _GENERATION_IDS in message and _GENERATION_LOGPROBS in message


class VLLMCaptureAdapter:
    """The adapter for a vLLM worker's chat completion (a dict, non-streamed).

    Ids are read where an RL vLLM worker puts them: a message-level bundle
    (``choices[0].message`` with ``prompt_token_ids``, ``generation_token_ids`` and
    ``generation_log_probs``) first; otherwise the top-level ``prompt_token_ids`` and the
    ``choices[0].logprobs.content`` entries, whose ``token`` is spelled ``token_id:N`` when the
    request asked for ``return_tokens_as_token_ids``. ``choices[0].token_ids`` is never read.
    """

    def enter_prefix(self, request: _Request, prefix_ids: Iterable[int]) -> _Request:
        """Set ``request[PREFIX_IDS_FIELD] = list(prefix_ids)`` in place; return ``request``.

        Each id must be an int >= 0 (``TypeError`` / ``ValueError``, the request untouched).
        """
        return _enter_prefix(request, prefix_ids)

    def extract_prompt_ids(self, payload: Mapping[str, Any]) -> list[int]:
        """The prompt ids: the top-level ``prompt_token_ids``, else (absent or null)
        ``choices[0].message.prompt_token_ids`` of an answer with exactly one object choice whose
        ``message`` is an object or absent. No ids anywhere is a ``ValueError``.

        The top level wins over a message-level bundle, as 0.7.0's released adapter reads it
        (its text says the bundle is read first; its code, which trainers run, does not).
        """
        answer = _object(payload)
        top = answer.get(_PROMPT_IDS)
        if top is not None:
            return _ids_list(top, "prompt_token_ids")
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            count = len(choices) if isinstance(choices, list) else _kind(choices)
            raise ValueError(
                "the answer has no prompt_token_ids, and choices[0].message.prompt_token_ids is "
                f"read only from exactly one choice (choices: {count})"
            )
        choice = choices[0]
        if not isinstance(choice, Mapping):
            raise TypeError(f"choices[0] must be an object, not {_kind(choice)}")
        choice_message = choice.get("message")
        if choice_message is None and "message" not in choice:
            choice_message = {}
        if not isinstance(choice_message, Mapping):
            raise TypeError(f"choices[0].message must be an object, not {_kind(choice_message)}")
        nested = choice_message.get(_PROMPT_IDS)
        if nested is None:
            raise ValueError(
                "the answer has no prompt_token_ids (top level or choices[0].message); the "
                "worker's engine must return the prompt ids"
            )
        return _ids_list(nested, "choices[0].message.prompt_token_ids")

    def extract_generation(self, payload: Mapping[str, Any]) -> tuple[list[int], list[float]]:
        """``(ids, logprobs)`` of ``choices[0]``, equal lengths (an empty generation is allowed).

        From the message's ``generation_token_ids`` / ``generation_log_probs`` when both keys
        are there, else from ``choices[0].logprobs.content[*]``: ``token`` (``token_id:N``,
        ``"N"`` or an int) and ``logprob``. A null ``logprobs`` or ``content`` is an error.
        """
        answer = _object(payload)
        choice = _first_choice(answer)
        message = choice.get("message")
        if isinstance(message, Mapping) and _has_bundle(message):
            where = "choices[0].message"
            ids = _ids_list(message[_GENERATION_IDS], f"{where}.{_GENERATION_IDS}")
            raw = message[_GENERATION_LOGPROBS]
            if not isinstance(raw, list):
                raise TypeError(f"{where}.{_GENERATION_LOGPROBS} must be a list, not {_kind(raw)}")
            logprobs = [
                _json_logprob(v, f"{where}.{_GENERATION_LOGPROBS}[{i}]") for i, v in enumerate(raw)
            ]
            if len(ids) != len(logprobs):
                raise ValueError(
                    f"{where} has {len(ids)} {_GENERATION_IDS} but {len(logprobs)} "
                    f"{_GENERATION_LOGPROBS}"
                )
            return ids, logprobs
        block = choice.get("logprobs")
        if not isinstance(block, Mapping):
            raise ValueError(
                f"choices[0].logprobs is {_kind(block)}, not an object (was the request sent "
                "with logprobs: true?)"
            )
        content = block.get("content")
        if not isinstance(content, list):
            raise ValueError(f"choices[0].logprobs.content must be a list, not {_kind(content)}")
        ids = []
        logprobs = []
        for index, entry in enumerate(content):
            where = f"choices[0].logprobs.content[{index}]"
            if not isinstance(entry, Mapping):
                raise TypeError(f"{where} must be an object, not {_kind(entry)}")
            if "token" not in entry:
                raise ValueError(f"{where} has no token")
            if "logprob" not in entry:
                raise ValueError(f"{where} has no logprob")
            ids.append(_token_id(entry["token"], f"{where}.token"))
            logprobs.append(_json_logprob(entry["logprob"], f"{where}.logprob"))
        return ids, logprobs

    def extract_extras(self, payload: Mapping[str, Any]) -> dict[str, Any] | None:
        """``{"routed_experts"?, "media_spans"?}``, or None when the answer has neither.

        ``routed_experts`` is ``choices[0].message.routed_experts`` unless absent or null, kept
        as found (an envelope string, or an object or list; anything else is a ``TypeError``;
        it is never decoded here, its digest covers what is stored). ``media_spans`` is the
        top-level key whenever present: a list of objects (a present null is an error). The
        values are the payload's own, not copies.
        """
        answer = _object(payload)
        extras: dict[str, Any] = {}
        message = _probe_message(answer)
        routed = message.get(ROUTED_EXPERTS_FIELD) if message is not None else None
        if routed is not None:
            if not isinstance(routed, str | dict | list):
                raise TypeError(
                    "choices[0].message.routed_experts must be a string, object or list, "
                    f"not {_kind(routed)}"
                )
            extras[ROUTED_EXPERTS_FIELD] = routed
        if MEDIA_SPANS_FIELD in answer:
            spans = answer[MEDIA_SPANS_FIELD]
            if not isinstance(spans, list):
                raise TypeError(f"media_spans must be a list of objects, not {_kind(spans)}")
            for index, span in enumerate(spans):
                if not isinstance(span, dict):
                    raise TypeError(f"media_spans[{index}] must be an object, not {_kind(span)}")
            extras[MEDIA_SPANS_FIELD] = spans
        # None, not {}: the two digest differently, and "nothing found" is None by contract.
        return extras or None


def _field(payload: object, name: str) -> object:
    if isinstance(payload, Mapping):
        if name not in payload:
            raise ValueError(f"the Megatron payload has no {name!r} key")
        return payload[name]
    missing = object()
    value = getattr(payload, name, missing)
    if value is missing:
        raise ValueError(f"the Megatron payload ({type(payload).__name__}) has no {name} attribute")
    return value


def _megatron_sequence(payload: object, name: str) -> Sequence[object]:
    value = _field(payload, name)
    # A string is a Sequence too: each character would be taken for an element.
    if not isinstance(value, Sequence) or isinstance(value, str | bytes | bytearray):
        raise TypeError(f"{name} must be a non-string sequence, not {_kind(value)}")
    return value


class MegatronCaptureAdapter:
    """The adapter for Megatron Inference's offloaded payload: an object or a mapping.

    Reads ``prompt_token_ids``, ``generated_token_ids`` and ``generated_log_probs`` (attribute,
    or key of a mapping); each must be present and a non-string sequence. Ids must already be
    ints (>= 0): a float, string or bool element is an error, never coerced, since the payload is
    in-process data where such an element means a bug upstream, not a JSON spelling.
    """

    def enter_prefix(self, request: _Request, prefix_ids: Iterable[int]) -> _Request:
        """As ``VLLMCaptureAdapter.enter_prefix``."""
        return _enter_prefix(request, prefix_ids)

    def extract_prompt_ids(self, payload: object) -> list[int]:
        """``prompt_token_ids``, exact ints >= 0."""
        values = _megatron_sequence(payload, "prompt_token_ids")
        return [_exact_id(v, f"prompt_token_ids[{i}]") for i, v in enumerate(values)]

    def extract_generation(self, payload: object) -> tuple[list[int], list[float]]:
        """``generated_token_ids`` (exact ints >= 0) and ``generated_log_probs`` (numbers, not
        bools, finite; returned as floats), of equal length."""
        raw_ids = _megatron_sequence(payload, "generated_token_ids")
        raw_logprobs = _megatron_sequence(payload, "generated_log_probs")
        ids = [_exact_id(v, f"generated_token_ids[{i}]") for i, v in enumerate(raw_ids)]
        logprobs: list[float] = []
        for index, value in enumerate(raw_logprobs):
            where = f"generated_log_probs[{index}]"
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{where} must be a number, not {_kind(value)}")
            try:
                number = float(value)
            except OverflowError:
                raise ValueError(f"{where} is {value!r}, beyond float64") from None
            if not math.isfinite(number):
                raise ValueError(f"{where} is {number!r}; logprobs must be finite")
            logprobs.append(number)
        if len(ids) != len(logprobs):
            raise ValueError(
                f"{len(ids)} generated_token_ids but {len(logprobs)} generated_log_probs"
            )
        return ids, logprobs

    def extract_extras(self, payload: object) -> dict[str, Any] | None:
        """Always None: Megatron's routed-expert rows are one shorter than its tokens, so they
        cannot be staged as a per-token report."""
        return None


def _check_backend(backend: object) -> Backend:
    if backend == "vllm_worker":
        return "vllm_worker"
    if backend == "megatron_worker":
        return "megatron_worker"
    raise ValueError(f"unknown external staging backend {backend!r}; expected one of {BACKENDS}")


def prepare_engine_request(
    body: Mapping[str, Any],
    admission: Mapping[str, Any] | None,
    *,
    backend: str = "vllm_worker",
) -> dict[str, Any]:
    """The engine-bound chat body of a call with a capture context, as a new dict.

    Always: ``stream`` set to ``False`` and ``stream_options`` removed. A body already asking to
    stream (any ``stream`` other than absent, null or false) is a ``ValueError``
    (``STREAMING_REFUSED``): the worker must stage before it answers, which a stream cannot.

    With an admission (its JSON form; an unadmitted call passes None and gets nothing more):

    - ``vllm_worker``: ``ng_capture`` = the admission, ``logprobs: true``, ``top_logprobs: 0``,
      ``return_tokens_as_token_ids: true``; for ``mode`` ``token_in`` also
      ``required_prefix_token_ids`` = the admission's inline prefix.
    - ``megatron_worker``: ``n`` must be absent, null or 1 (``ValueError``); ``offload_params``
      (a new ``{}`` when absent; present, it must be an object, else ``ValueError``) gets
      ``ng_capture``; ``logprobs: true``, ``top_logprobs: 0``.

    An unknown ``backend`` is a ``ValueError``. ``body`` and ``admission`` are not mutated; the
    result shares the body's other values and holds a copy of the admission.
    """
    if not isinstance(body, Mapping):
        raise TypeError(f"body must be a mapping, not {_kind(body)}")
    kind = _check_backend(backend)
    stream = body.get("stream")
    if stream is not None and stream is not False:
        raise ValueError(STREAMING_REFUSED)
    request = {k: v for k, v in body.items() if k != "stream_options"}
    request["stream"] = False
    if admission is None:
        return request
    if not isinstance(admission, Mapping):
        raise TypeError(f"admission must be a mapping (its JSON form), not {_kind(admission)}")
    capture = copy.deepcopy(dict(admission))
    mode = capture.get("mode")
    if mode not in ("text", "token_in"):
        raise ValueError(f"admission mode must be 'text' or 'token_in', not {mode!r}")
    if kind == "vllm_worker":
        request[CAPTURE_FIELD] = capture
        request["logprobs"] = True
        request["top_logprobs"] = 0
        request["return_tokens_as_token_ids"] = True
        if mode == "token_in":
            prefix = capture.get(PREFIX_IDS_FIELD)
            if not isinstance(prefix, list):
                raise ValueError(
                    f"a token_in admission's {PREFIX_IDS_FIELD} must be a list, not {_kind(prefix)}"
                )
            request[PREFIX_IDS_FIELD] = list(prefix)
        return request
    n = body.get("n")
    # Checked by type too: True == 1 in Python, but a JSON true is not the count 1.
    if n is not None and not (type(n) is int and n == 1):
        raise ValueError(f"megatron_worker staging needs one completion per call (n is {n!r})")
    if "offload_params" in body:
        params = body["offload_params"]
        if not isinstance(params, Mapping):
            raise ValueError(f"offload_params must be an object, not {_kind(params)}")
        offload = dict(params)
    else:
        offload = {}
    offload[CAPTURE_FIELD] = capture
    request["offload_params"] = offload
    request["logprobs"] = True
    request["top_logprobs"] = 0
    return request


def _without(value: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any] | None:
    """A copy of ``value`` without ``names``, or None when it has none of them."""
    if not any(name in value for name in names):
        return None
    return {k: v for k, v in value.items() if k not in names}


def _strip_choice(choice: object) -> object:
    if not isinstance(choice, Mapping):
        return choice
    stripped = _without(choice, TRANSPORT_CHOICE_FIELDS)
    message = choice.get("message")
    clean_message = (
        _without(message, TRANSPORT_MESSAGE_FIELDS) if isinstance(message, Mapping) else None
    )
    if clean_message is not None:
        if stripped is None:
            stripped = dict(choice)
        stripped["message"] = clean_message
    return choice if stripped is None else stripped


def strip_capture_transport_fields(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's answer without the token transport fields, as a new dict for the client.

    Removed: top-level ``ng_commit_coords`` and ``prompt_token_ids``; each choice's ``logprobs``
    and ``token_ids`` (so a client that asked for logprobs gets none); each
    ``choices[i].message``'s ``prompt_token_ids``, ``generation_token_ids``,
    ``generation_log_probs``, ``routed_experts`` and ``compact_prompt_token_ids``. Everything else
    is carried, the top-level ``media_spans`` and unknown keys included. Only the containers that
    lose a key are copied; the rest is shared with ``answer``, which is not mutated.
    """
    if not isinstance(answer, Mapping):
        raise TypeError(f"the answer must be a mapping, not {_kind(answer)}")
    result = {k: v for k, v in answer.items() if k not in TRANSPORT_ANSWER_FIELDS}
    choices = result.get("choices")
    if isinstance(choices, list):
        stripped = [_strip_choice(choice) for choice in choices]
        if any(new is not old for new, old in zip(stripped, choices, strict=True)):
            result["choices"] = stripped
    return result
