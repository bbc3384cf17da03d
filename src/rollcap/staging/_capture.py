"""The worker's side of external staging: one admitted call in, one ``CommitCoords`` out.

``RolloutTokenCapture`` is what an inference worker hosts (STAGING §1.5, §2.1, §5.2). For each
engine call the gate admitted (``ng_capture``), the worker:

1. parses the admission (``CaptureAdmission.model_validate``), resolves the prefix ids (for a
   ``token_in`` call: fetch the ``staging_chain`` keys from its source and concatenate their
   ``token_ids_delta``), and calls ``begin_call``, which checks them and stamps the weight
   version; a caller bug raises ``CaptureError`` there and produces no coords;
2. pins the engine's prompt to the prefix (``adapter.enter_prefix``) and generates;
3. completes the call exactly once: ``complete_call`` (ids in hand),
   ``complete_call_from_response`` (the adapter reads them out of the engine's answer) or
   ``fail_call`` (the engine failed). The record is staged through the sink before the
   coords are returned, so the worker answers only about durable records.

Every failure after ``begin_call`` (extraction, delta building, float or extras validation,
the sink) becomes ``capture_failed`` coords, with the reason logged on ``rollcap.staging``;
it never fails the model completion, which the worker still serves, with the coords. A second
completion of one call raises ``CaptureError``.

The capture keeps no state per rollout or per call (the prefix comes from the caller, and the
``ActiveCall`` carries what the completion needs), so its memory does not grow with the calls
it has seen, and completions may run concurrently from several threads.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollcap.staging._adapters import CaptureAdapter
from rollcap.staging._digest import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    hash_token_ids,
)
from rollcap.staging._records import (
    CaptureAdmission,
    CaptureError,
    CommitCoords,
    StagedCallRecord,
    StageResult,
    StreamingUnsupportedError,
    staging_key,
)
from rollcap.staging._sinks import StagingSink

__all__ = [
    "ActiveCall",
    "CaptureHost",
    "CaptureServingLayer",
    "RolloutTokenCapture",
    "WeightVersionProvider",
    "install_capture",
]

logger = logging.getLogger("rollcap.staging")

WeightVersionProvider = Callable[[], int]
"""A zero-argument callable returning the trainer-owned weight version (an exact int >= 0)."""

# Ids and versions end up as u64 in the digest: anything larger cannot be staged.
_U64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True, eq=False)
class ActiveCall:
    """One begun call, as ``begin_call`` resolved it; completes exactly once.

    ``prefix_token_ids`` are the ids the engine's prompt must start with (``()`` for a ``text``
    call; ``prev_len`` ids for a ``token_in`` one); ``weight_version`` is stamped on the record
    and on the coords, failed ones included; ``staging_key`` is the default key
    (``<rollout_id>/<model_call_id>``): the coords carry the key the sink returned instead.
    """

    admission: CaptureAdmission
    prefix_token_ids: tuple[int, ...]
    weight_version: int
    staging_key: str
    # Acquired (never released) by the one completion that wins: an atomic "at most once"
    # without a lock held across the sink call.
    _done: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def completed(self) -> bool:
        """Whether a completion (``complete_*`` or ``fail_call``) has claimed this call."""
        return self._done.locked()

    def _claim(self) -> None:
        if not self._done.acquire(blocking=False):
            raise CaptureError(f"call {self.staging_key} was already completed")


def _exact_ids(value: object, name: str) -> list[int]:
    """``value`` as a list of exact ints in 0..2**64-1; ``TypeError``/``ValueError`` if not."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, not {type(value).__name__}")
    ids = list(value)
    # Checked in C for the common case (see _digest.encode_token_ids); the loop names a culprit.
    if not set(map(type, ids)) - {int}:
        try:
            array("Q", ids)
        except OverflowError:
            pass
        else:
            return ids
    for index, item in enumerate(ids):
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(f"{name}[{index}] must be an int, not {type(item).__name__}")
        if not 0 <= item <= _U64_MAX:
            raise ValueError(f"{name}[{index}] is {item}; token ids are in 0..2**64-1")
    return ids


def _exact_floats(value: object, name: str) -> list[float]:
    """``value`` as a list of exact Python floats (an int, bool or numpy scalar is refused:
    the digest hashes a float's binary32 rounding and must not guess what an int meant)."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of floats, not {type(value).__name__}")
    floats = list(value)
    if not set(map(type, floats)) - {float}:
        return floats
    for index, item in enumerate(floats):
        if type(item) is not float:
            raise TypeError(f"{name}[{index}] must be a float, not {type(item).__name__}")
    return floats


class RolloutTokenCapture:
    """Stages each admitted engine call through ``sink`` and answers with its commit coords.

    ``weight_version_fn`` gives the version stamped at ``begin_call`` when the caller does not
    pass one; ``adapter`` reads ids, logprobs and extras out of an engine answer for
    ``complete_call_from_response`` (without one, only ``complete_call`` and ``fail_call``
    work). The sink must be thread-safe: completions call it concurrently.
    """

    def __init__(
        self,
        *,
        sink: StagingSink,
        weight_version_fn: WeightVersionProvider,
        adapter: CaptureAdapter | None = None,
    ) -> None:
        """``TypeError`` when the sink has no ``stage``, the provider is not callable, or the
        adapter lacks one of the ``extract_*`` methods."""
        if not callable(getattr(sink, "stage", None)):
            raise TypeError(f"sink must have a stage() method, not {type(sink).__name__}")
        if not callable(weight_version_fn):
            raise TypeError("weight_version_fn must be a zero-argument callable")
        if adapter is not None:
            for name in ("extract_prompt_ids", "extract_generation", "extract_extras"):
                if not callable(getattr(adapter, name, None)):
                    raise TypeError(f"adapter {type(adapter).__name__} has no {name}()")
        self._sink = sink
        self._weight_version_fn = weight_version_fn
        self._adapter = adapter

    @property
    def sink(self) -> StagingSink:
        return self._sink

    @property
    def adapter(self) -> CaptureAdapter | None:
        return self._adapter

    def begin_call(
        self,
        admission: CaptureAdmission,
        *,
        prefix_token_ids: list[int] | None = None,
        stream: bool = False,
        weight_version: int | None = None,
    ) -> ActiveCall:
        """Check one admitted call and stamp its weight version (STAGING §1.5).

        - ``admission`` must be a ``CaptureAdmission`` (``TypeError``); ``stream`` true raises
          ``StreamingUnsupportedError`` (only complete answers are staged).
        - ``text``: no prefix (``prefix_token_ids`` None or empty); resolved ``()``.
        - ``token_in``: ``prefix_token_ids``, when given, must be a list of exact ints >= 0 of
          length ``prev_len``, equal to the admission's inline prefix when that is non-empty;
          when not given, the inline prefix is used and must be non-empty (an admission with
          a ``staging_chain`` needs the caller's ids, fetched from its source).
        - the version is ``weight_version`` when given (the engine owns the per-call
          version), else ``weight_version_fn()``; it must be an exact int in 0..2**64-1.

        Violations raise ``CaptureError`` and produce no coords; nothing is kept, so the call
        is not poisoned by them.
        """
        if not isinstance(admission, CaptureAdmission):
            raise TypeError(f"admission must be a CaptureAdmission, not {type(admission).__name__}")
        key = staging_key(admission.rollout_id, admission.model_call_id)
        if stream:
            raise StreamingUnsupportedError(
                f"call {key}: token capture stages complete answers only; stream must be false"
            )
        prefix = self._resolve_prefix(admission, prefix_token_ids, key)
        version = self._resolve_weight_version(weight_version, key)
        return ActiveCall(
            admission=admission,
            prefix_token_ids=prefix,
            weight_version=version,
            staging_key=key,
        )

    @staticmethod
    def _resolve_prefix(
        admission: CaptureAdmission, given: list[int] | None, key: str
    ) -> tuple[int, ...]:
        inline = admission.required_prefix_token_ids
        if admission.mode == "text":
            if given is not None and (not isinstance(given, list) or given):
                raise CaptureError(f"call {key}: a text call takes no prefix ids")
            return ()
        if given is None:
            if not inline:
                raise CaptureError(
                    f"call {key}: the admission's inline prefix is empty; pass prefix_token_ids "
                    "(the concatenated token_ids_delta of its staging_chain)"
                )
            return tuple(inline)
        if not isinstance(given, list):
            raise CaptureError(
                f"call {key}: prefix_token_ids must be a list, not {type(given).__name__}"
            )
        for index, item in enumerate(given):
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise CaptureError(
                    f"call {key}: prefix_token_ids[{index}] is {item!r}, not an int >= 0"
                )
        if len(given) != admission.prev_len:
            raise CaptureError(
                f"call {key}: {len(given)} prefix ids for prev_len {admission.prev_len}"
            )
        if inline and given != inline:
            raise CaptureError(f"call {key}: prefix_token_ids differ from the inline prefix")
        return tuple(given)

    def _resolve_weight_version(self, given: int | None, key: str) -> int:
        if given is None:
            try:
                given = self._weight_version_fn()
            except Exception as exc:
                raise CaptureError(f"call {key}: weight_version_fn failed: {exc!r}") from exc
        if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given <= _U64_MAX:
            raise CaptureError(f"call {key}: weight_version {given!r} is not an int >= 0")
        return given

    def complete_call(
        self,
        call: ActiveCall,
        *,
        prompt_token_ids: Sequence[int],
        generated_token_ids: Sequence[int],
        generated_logprobs: Sequence[float],
        extras: Any = None,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """Stage the call from the engine's exact ids; ``staged`` or ``capture_failed`` coords.

        The record is ``prompt_token_ids[prev_len:]`` (mask 0.0, logprob 0.0) then the
        generated ids (mask 1.0, their logprobs, kept as the float64 values given) (STAGING
        §2.1). ``capture_failed`` when the prompt does not start with the resolved prefix, it
        is shorter than ``prev_len``, the generated ids and logprobs differ in length, the
        delta is empty, an id is not an exact int, a logprob not an exact finite float in
        float32 range, the extras not digestible (§2.3), or the sink fails (raises, returns
        something other than a ``StageResult``, says ``ok: false``, or takes no
        ``attachments`` keyword when attachments are given). ``attachments`` (a mapping, even
        empty) is handed to the sink as the ``attachments`` keyword; ``None`` omits it.
        ``CaptureError`` when the call was already completed.
        """
        self._check_call(call)
        call._claim()
        try:
            record = _build_record(
                call, prompt_token_ids, generated_token_ids, generated_logprobs, extras
            )
        except Exception as exc:
            return self._failed(call, f"the staged record cannot be built: {exc}")
        return self._stage(call, record, attachments)

    def complete_call_from_response(
        self,
        call: ActiveCall,
        payload: Any,
        *,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """``complete_call`` with the ids, logprobs and extras the adapter reads from the
        engine's answer ``payload``. ``CaptureError`` (raised, the call left open) when the
        capture has no adapter or the call was already completed; an extraction error is
        ``capture_failed``."""
        self._check_call(call)
        adapter = self._adapter
        if adapter is None:
            raise CaptureError(
                f"call {call.staging_key}: complete_call_from_response needs an adapter; "
                "use complete_call or fail_call"
            )
        call._claim()
        try:
            prompt = adapter.extract_prompt_ids(payload)
            generated, logprobs = adapter.extract_generation(payload)
            extras = adapter.extract_extras(payload)
        except Exception as exc:
            return self._failed(call, f"the adapter could not read the engine answer: {exc!r}")
        try:
            record = _build_record(call, prompt, generated, logprobs, extras)
        except Exception as exc:
            return self._failed(call, f"the staged record cannot be built: {exc}")
        return self._stage(call, record, attachments)

    def fail_call(self, call: ActiveCall, *, reason: str) -> CommitCoords:
        """The engine failed before anything could be staged: ``capture_failed`` coords (the
        reason is only logged; the wire has no field for it). ``CaptureError`` when the call
        was already completed."""
        self._check_call(call)
        call._claim()
        return self._failed(call, f"the call failed before staging: {reason}")

    @staticmethod
    def _check_call(call: object) -> None:
        if not isinstance(call, ActiveCall):
            raise TypeError(f"call must be an ActiveCall from begin_call, not {type(call)}")

    def _stage(
        self,
        call: ActiveCall,
        record: StagedCallRecord,
        attachments: Mapping[str, Any] | None,
    ) -> CommitCoords:
        try:
            if attachments is None:
                result: object = self._sink.stage(record)
            elif not isinstance(attachments, Mapping):
                return self._failed(
                    call, f"attachments must be a mapping, not {type(attachments).__name__}"
                )
            else:
                # Only with attachments: a legacy stage(record) sink keeps working for text
                # calls, and refuses (TypeError) rather than drops what it cannot store.
                result = self._sink.stage(record, attachments=attachments)
        except Exception as exc:
            return self._failed(call, f"the sink raised {exc!r}")
        if not isinstance(result, StageResult):
            return self._failed(call, f"the sink returned {type(result).__name__}, not StageResult")
        if not result.ok or result.staging_key is None:
            return self._failed(call, f"the sink refused the record: {result.error}")
        try:
            return CommitCoords(
                rollout_id=record.rollout_id,
                model_call_id=record.model_call_id,
                parent_call_id=record.parent_call_id,
                prev_len=record.prev_len,
                delta_len=record.delta_len,
                cum_len=record.cum_len,
                weight_version=record.weight_version,
                disposition="staged",
                digest=record.digest,
                extras_digest=record.extras_digest,
                staging_key=result.staging_key,
                chain_hash=record.chain_hash,
                cumulative_hash=record.cumulative_hash,
            )
        except Exception as exc:  # pragma: no cover - a validated record always fits
            return self._failed(call, f"the commit coordinates cannot be built: {exc}")

    @staticmethod
    def _failed(call: ActiveCall, reason: str) -> CommitCoords:
        admission = call.admission
        logger.warning(
            "capture_failed: rollout %r call %r: %s",
            admission.rollout_id,
            admission.model_call_id,
            reason,
        )
        return CommitCoords(
            rollout_id=admission.rollout_id,
            model_call_id=admission.model_call_id,
            parent_call_id=admission.parent_call_id,
            prev_len=admission.prev_len,
            delta_len=0,
            cum_len=admission.prev_len,
            weight_version=call.weight_version,
            disposition="capture_failed",
        )


def _build_record(
    call: ActiveCall,
    prompt_token_ids: object,
    generated_token_ids: object,
    generated_logprobs: object,
    extras: object,
) -> StagedCallRecord:
    """The staged record of STAGING §2.1; ``TypeError``/``ValueError`` saying why not."""
    admission = call.admission
    prompt = _exact_ids(prompt_token_ids, "prompt_token_ids")
    generated = _exact_ids(generated_token_ids, "generated_token_ids")
    logprobs = _exact_floats(generated_logprobs, "generated_logprobs")
    prev = admission.prev_len
    if len(prompt) < prev:
        raise ValueError(f"the prompt has {len(prompt)} ids, fewer than prev_len {prev}")
    # Compared as a tuple slice: a copy of prev ids, not of the whole prompt.
    if tuple(prompt[:prev]) != call.prefix_token_ids:
        raise ValueError("the prompt does not start with the resolved prefix ids")
    if len(generated) != len(logprobs):
        raise ValueError(f"{len(generated)} generated ids but {len(logprobs)} logprobs")
    carry = len(prompt) - prev
    token_ids_delta = prompt[prev:] + generated
    if not token_ids_delta:
        raise ValueError("the delta is empty: no new prompt ids and no generated ids")
    fields: dict[str, Any] = {
        "schema_version": STAGING_SCHEMA_VERSION,
        "digest_version": STAGING_DIGEST_VERSION,
        "extras_digest_version": EXTRAS_DIGEST_VERSION,
        "rollout_id": admission.rollout_id,
        "model_call_id": admission.model_call_id,
        "parent_call_id": admission.parent_call_id,
        "mode": admission.mode,
        "prev_len": prev,
        "delta_len": len(token_ids_delta),
        "cum_len": prev + len(token_ids_delta),
        "weight_version": call.weight_version,
        "token_ids_delta": token_ids_delta,
        "token_mask_delta": [0.0] * carry + [1.0] * len(generated),
        "generation_log_probs_delta": [0.0] * carry + logprobs,
        "extras_digest": compute_extras_digest(extras),
        "chain_hash": compute_chain_hash(admission.parent_chain_hash, token_ids_delta),
        "cumulative_hash": hash_token_ids(prompt + generated),
    }
    # compute_staging_digest refuses whatever a record must never hold, the extras digest was
    # computed from the extras themselves, and the sink parses what it stores as a reader
    # would: validating here once more would recompute both digests for nothing.
    digest = compute_staging_digest(**fields)
    return StagedCallRecord.model_construct(**fields, digest=digest, extras=extras)


class CaptureServingLayer(Protocol):
    """A serving layer a capture can be installed on (``install_capture``)."""

    def install_token_capture(self, capture: RolloutTokenCapture) -> None: ...


class CaptureHost:
    """The minimal serving layer: it holds the installed capture in ``capture``."""

    def __init__(self) -> None:
        self.capture: RolloutTokenCapture | None = None

    def install_token_capture(self, capture: RolloutTokenCapture) -> None:
        """Install ``capture`` (replacing any earlier one); ``TypeError`` for anything else."""
        if not isinstance(capture, RolloutTokenCapture):
            raise TypeError(f"capture must be a RolloutTokenCapture, not {type(capture).__name__}")
        self.capture = capture


def install_capture(
    serving_layer: CaptureServingLayer,
    *,
    sink: StagingSink,
    weight_version_fn: WeightVersionProvider,
    adapter: CaptureAdapter | None = None,
) -> RolloutTokenCapture:
    """Build a ``RolloutTokenCapture`` and install it on ``serving_layer`` (STAGING §5.1).

    ``TypeError`` when the sink has no ``stage``, the provider is not callable, or the layer
    has no ``install_token_capture(capture)``; nothing is installed then.
    """
    if not callable(getattr(sink, "stage", None)):
        raise TypeError(f"sink must have a stage() method, not {type(sink).__name__}")
    if not callable(weight_version_fn):
        raise TypeError("weight_version_fn must be a zero-argument callable")
    install = getattr(serving_layer, "install_token_capture", None)
    if not callable(install):
        raise TypeError(
            f"serving layer {type(serving_layer).__name__} has no install_token_capture(capture)"
        )
    capture = RolloutTokenCapture(sink=sink, weight_version_fn=weight_version_fn, adapter=adapter)
    install(capture)
    return capture
