"""``RolloutTokenCapture``: turn one served model call into one staged token delta.

Contract: every begun call ends in exactly one ``CommitCoords``. They are ``staged`` only after
the sink returned; every failure (bad input, a prompt that does not start with the ids it must,
an unknown parent, an extraction error, a sink error) gives ``capture_failed`` coords with a
reason instead of an exception, so the worker still serves the generation.

The capture remembers, per rollout, each staged call's token delta, parent and chain hash (in
memory, for a bounded number of rollouts, least recently used out first), which is what it needs
to check a child call's prompt against its parent's full ids. It is safe to use from several
threads; the sink is called outside the lock.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollcap.staging._adapters import CaptureAdapter
from rollcap.staging._digest import ROOT_CHAIN_HASH
from rollcap.staging._linearize import lineage, verify_records
from rollcap.staging._records import (
    REASON_CALL_FAILED,
    REASON_DUPLICATE_CALL,
    REASON_EXTRACTION_FAILED,
    REASON_INTERNAL_ERROR,
    REASON_INVALID_ADMISSION,
    REASON_INVALID_INPUT,
    REASON_NOT_IN_FLIGHT,
    REASON_PARENT_PREFIX_MISMATCH,
    REASON_REQUIRED_PREFIX_MISMATCH,
    REASON_SINK_FAILED,
    REASON_UNKNOWN_PARENT,
    Admission,
    CommitCoords,
    StagedCallRecord,
    check_float32_values,
    check_token_ids,
)
from rollcap.staging._sinks import StagingSink

__all__ = ["DEFAULT_MAX_ROLLOUTS", "PendingCall", "RolloutTokenCapture"]

logger = logging.getLogger("rollcap.staging")

DEFAULT_MAX_ROLLOUTS = 4096
_U64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True)
class _StagedCall:
    # The delta only: a call's full ids are rebuilt through its parents, so memory grows with
    # the tokens of a rollout rather than with the square of its turns.
    parent_model_call_id: str | None
    prev_len: int
    delta: array[int]
    chain_hash: str


@dataclass(frozen=True, slots=True, eq=False)
class PendingCall:
    """A begun call. Pass it to exactly one of ``complete_call``, ``complete_call_from_response``
    or ``fail_call``; ``failure`` is already set when the call cannot be staged whatever the
    engine returns (its completion then gives ``capture_failed`` coords with that reason)."""

    rollout_id: str
    model_call_id: str
    weight_version: int
    admission: Admission | None
    failure: str | None = None
    # What the prompt must start with, resolved at begin_call from the parent and the pin.
    _prefix: tuple[int, ...] = field(default=(), repr=False)
    _prev_len: int = field(default=0, repr=False)
    _parent_chain_hash: str = field(default=ROOT_CHAIN_HASH, repr=False)

    @property
    def staging_key(self) -> str:
        return f"{self.rollout_id}/{self.model_call_id}"


def _first_difference(expected: Sequence[int], actual: Sequence[int]) -> int:
    for index, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return index
    return min(len(expected), len(actual))


def _float32(values: object) -> tuple[float, ...]:
    """Logprobs rounded to binary32, the precision the digest covers, so the staged value is
    exactly the hashed one; ``ValueError`` for anything but finite numbers."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Sequence):
        raise ValueError(
            f"generated_logprobs must be a list of numbers, not {type(values).__name__}",
        )
    if set(map(type, values)) - {int, float}:
        raise ValueError("generated_logprobs must hold only numbers")
    # A finite double beyond binary32's range rounds to an infinity, which the check refuses.
    return check_float32_values(array("f", values).tolist(), "generated_logprobs")


class RolloutTokenCapture:
    """Builds, stages and acknowledges exact per-call token deltas for RL training."""

    def __init__(
        self,
        sink: StagingSink,
        adapter: CaptureAdapter,
        weight_version: int,
        *,
        max_rollouts: int = DEFAULT_MAX_ROLLOUTS,
    ) -> None:
        if not callable(getattr(sink, "stage", None)):
            raise TypeError("sink must have a stage(record, *, attachments=None) method")
        if isinstance(max_rollouts, bool) or not isinstance(max_rollouts, int) or max_rollouts < 1:
            raise ValueError(f"max_rollouts must be an integer >= 1, not {max_rollouts!r}")
        self.sink = sink
        self.adapter = adapter
        self.max_rollouts = max_rollouts
        self._weight_version = self._check_weight_version(weight_version)
        self._lock = threading.Lock()
        self._rollouts: OrderedDict[str, dict[str, _StagedCall]] = OrderedDict()
        self._in_flight: dict[str, PendingCall] = {}

    @staticmethod
    def _check_weight_version(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64_MAX:
            raise ValueError(f"weight_version must be an integer in 0..2**64-1, not {value!r}")
        return value

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def set_weight_version(self, weight_version: int) -> None:
        """Calls begun from now on carry this version (a call keeps the one it began with)."""
        checked = self._check_weight_version(weight_version)
        with self._lock:
            self._weight_version = checked

    def forget(self, rollout_id: str) -> None:
        """Drop what is remembered of a rollout. Its later child calls recover it from the sink
        when the sink can read records back (``DirectoryStagingSink`` can), else fail."""
        with self._lock:
            self._rollouts.pop(rollout_id, None)

    @property
    def remembered_rollouts(self) -> list[str]:
        """The rollouts held in memory, least recently used first."""
        with self._lock:
            return list(self._rollouts)

    def _remembered(self, rollout_id: str) -> dict[str, _StagedCall]:
        """Under the lock: the rollout's calls, made most recent, least recent ones evicted."""
        calls = self._rollouts.get(rollout_id)
        if calls is None:
            calls = self._rollouts[rollout_id] = {}
            while len(self._rollouts) > self.max_rollouts:
                self._rollouts.popitem(last=False)
        else:
            self._rollouts.move_to_end(rollout_id)
        return calls

    def _knows(self, rollout_id: str, model_call_id: str) -> bool:
        with self._lock:
            calls = self._rollouts.get(rollout_id)
            return calls is not None and model_call_id in calls

    def _recover(self, rollout_id: str) -> None:
        """Remember a rollout's staged calls again from a sink that can read them back.

        A worker that restarted (or evicted the rollout) would otherwise fail every later call
        of it as ``unknown_parent``. What is read is verified as ``linearize`` would; a record
        that does not verify is not trusted, and the call fails as before.
        """
        read = getattr(self.sink, "read", None)
        if not callable(read):
            return
        try:
            records = read(rollout_id)
            verify_records(rollout_id, records)  # every digest, chain hash and link
        except Exception as exc:
            logger.warning(
                "token capture: rollout %s not recovered from the sink: %s", rollout_id, exc
            )
            return
        with self._lock:
            calls = self._remembered(rollout_id)
            for record in records:
                calls.setdefault(
                    record.model_call_id,
                    _StagedCall(
                        record.parent_model_call_id,
                        record.prev_len,
                        array("Q", record.token_ids),
                        record.chain_hash,
                    ),
                )

    def _full_ids(self, calls: Mapping[str, _StagedCall], model_call_id: str) -> array[int]:
        full: array[int] = array("Q")
        for staged in lineage(calls, model_call_id):
            del full[staged.prev_len :]
            full.extend(staged.delta)
        return full

    # -- begin ---------------------------------------------------------------------------------

    def begin_call(self, admission: Admission | Mapping[str, Any]) -> PendingCall:
        """Admit one call (an ``Admission`` or its JSON object). Never raises."""
        try:
            return self._begin(admission)
        except Exception as exc:  # the contract: never raise into the serving path
            logger.exception("token capture: begin_call failed unexpectedly")
            return PendingCall(
                "", "", self._weight_version, None, f"{REASON_INTERNAL_ERROR}: {exc}"
            )

    def _begin(self, admission: object) -> PendingCall:
        weight_version = self._weight_version
        if not isinstance(admission, Admission):
            try:
                admission = Admission.from_json(admission)
            except (ValueError, TypeError) as exc:
                ids = admission if isinstance(admission, Mapping) else {}
                rollout_id = ids.get("rollout_id")
                model_call_id = ids.get("model_call_id")
                return PendingCall(
                    rollout_id if isinstance(rollout_id, str) else "",
                    model_call_id if isinstance(model_call_id, str) else "",
                    weight_version,
                    None,
                    f"{REASON_INVALID_ADMISSION}: {exc}",
                )
        assert isinstance(admission, Admission)

        def pending(failure: str | None = None, **resolved: Any) -> PendingCall:
            return PendingCall(
                admission.rollout_id,
                admission.model_call_id,
                weight_version,
                admission,
                failure,
                **resolved,
            )

        key = admission.staging_key
        pinned = admission.required_prefix_token_ids
        parent_id = admission.parent_model_call_id
        if parent_id is not None and not self._knows(admission.rollout_id, parent_id):
            self._recover(admission.rollout_id)  # reads the sink: outside the lock
        with self._lock:
            calls = self._rollouts.get(admission.rollout_id)
            if calls is not None:
                self._rollouts.move_to_end(admission.rollout_id)
            if key in self._in_flight or (calls is not None and admission.model_call_id in calls):
                return pending(f"{REASON_DUPLICATE_CALL}: {key} was already begun or staged")
            if parent_id is None:
                # A root inherits nothing, even with a pinned prefix: its record holds the whole
                # prompt (prev_len 0), since no parent record holds the pinned ids.
                call = pending(_prefix=pinned or ())
            elif calls is None or parent_id not in calls:
                return pending(
                    f"{REASON_UNKNOWN_PARENT}: parent {parent_id} of {key} is neither remembered "
                    "by this capture nor staged (verifiably) in its sink",
                )
            else:
                parent = calls[parent_id]
                parent_full = self._full_ids(calls, parent_id)
                if pinned is None:
                    prefix = tuple(parent_full)
                elif len(pinned) > len(parent_full) or tuple(parent_full[: len(pinned)]) != pinned:
                    # The pin may cut into the parent's ids (a dropped reasoning tail, say),
                    # but what it keeps must be exactly what the parent saw and produced.
                    at = _first_difference(parent_full, pinned)
                    return pending(
                        f"{REASON_PARENT_PREFIX_MISMATCH}: the pinned prefix "
                        f"({len(pinned)} ids) is not a prefix of parent {parent_id}'s "
                        f"{len(parent_full)} ids (first difference at {at})",
                    )
                else:
                    prefix = pinned
                call = pending(
                    _prefix=prefix,
                    _prev_len=len(prefix),
                    _parent_chain_hash=parent.chain_hash,
                )
            self._in_flight[key] = call
            return call

    # -- complete ------------------------------------------------------------------------------

    def fail_call(self, call: PendingCall, reason: str) -> CommitCoords:
        """End a call that will not be staged (the engine failed, the client went away)."""
        try:
            self._release(call)
            rollout_id, model_call_id = self._ids(call)
            return CommitCoords.failed(
                REASON_CALL_FAILED,
                str(reason) or "no reason given",
                rollout_id=rollout_id,
                model_call_id=model_call_id,
            )
        except Exception as exc:
            logger.exception("token capture: fail_call failed unexpectedly")
            return CommitCoords.failed(REASON_INTERNAL_ERROR, str(exc))

    def complete_call_from_response(
        self,
        call: PendingCall,
        response: Mapping[str, Any],
        *,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """Extract the ids through the adapter, then ``complete_call``. Never raises."""
        try:
            prompt_ids = self.adapter.extract_prompt_ids(response)
            generated_ids, logprobs = self.adapter.extract_generation(response)
            extras = self.adapter.extract_extras(response)
        except Exception as exc:
            return self._fail(call, REASON_EXTRACTION_FAILED, f"{type(exc).__name__}: {exc}")
        return self.complete_call(
            call,
            prompt_token_ids=prompt_ids,
            generated_token_ids=generated_ids,
            generated_logprobs=logprobs,
            extras=extras,
            attachments=attachments,
        )

    def complete_call(
        self,
        call: PendingCall,
        *,
        prompt_token_ids: Sequence[int],
        generated_token_ids: Sequence[int],
        generated_logprobs: Sequence[float],
        extras: Mapping[str, Any] | None = None,
        attachments: Mapping[str, Any] | None = None,
    ) -> CommitCoords:
        """Stage the call's delta and return its coords. Never raises.

        ``attachments`` is handed to the sink only when it is a mapping; it never enters the
        record, its extras or any digest. A sink that takes no ``attachments`` keyword fails the
        capture; the write is not retried without them.
        """
        try:
            return self._complete(
                call,
                prompt_token_ids,
                generated_token_ids,
                generated_logprobs,
                extras,
                attachments,
            )
        except Exception as exc:
            logger.exception("token capture: complete_call failed unexpectedly")
            return self._fail(call, REASON_INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    def _complete(
        self,
        call: PendingCall,
        prompt_token_ids: object,
        generated_token_ids: object,
        generated_logprobs: object,
        extras: object,
        attachments: object,
    ) -> CommitCoords:
        if not isinstance(call, PendingCall):
            return CommitCoords.failed(
                REASON_INVALID_INPUT,
                f"call must be the PendingCall begin_call returned, not {type(call).__name__}",
            )
        if call.failure is not None:
            self._release(call)
            code, _, detail = call.failure.partition(": ")
            return self._coords_failed(call, code, detail)
        with self._lock:
            if self._in_flight.get(call.staging_key) is not call:
                return self._coords_failed(
                    call,
                    REASON_NOT_IN_FLIGHT,
                    f"{call.staging_key} was already completed or was not begun by this capture",
                )
        try:
            prompt = check_token_ids(prompt_token_ids, "prompt_token_ids")
            generated = check_token_ids(generated_token_ids, "generated_token_ids")
            logprobs = _float32(generated_logprobs)
            if len(logprobs) != len(generated):
                raise ValueError(
                    f"generated_logprobs has {len(logprobs)} values for {len(generated)} "
                    "generated ids",
                )
            if extras is not None and not isinstance(extras, Mapping):
                raise ValueError(f"extras must be a mapping or None, not {type(extras).__name__}")
            if attachments is not None and not isinstance(attachments, Mapping):
                raise ValueError(
                    f"attachments must be a mapping or None, not {type(attachments).__name__}",
                )
        except (ValueError, OverflowError, TypeError) as exc:
            return self._fail(call, REASON_INVALID_INPUT, str(exc))

        prefix = call._prefix
        if prompt[: len(prefix)] != prefix:
            at = _first_difference(prefix, prompt)
            code = (
                REASON_REQUIRED_PREFIX_MISMATCH
                if call.admission is not None and call.admission.required_prefix_token_ids
                else REASON_PARENT_PREFIX_MISMATCH
            )
            what = "the pinned prefix" if code == REASON_REQUIRED_PREFIX_MISMATCH else "its parent"
            return self._fail(
                call,
                code,
                f"the prompt ({len(prompt)} ids) does not start with the {len(prefix)} ids of "
                f"{what} (first difference at {at})",
            )
        prev_len = call._prev_len
        prompt_delta = prompt[prev_len:]
        try:
            record = StagedCallRecord.create(
                rollout_id=call.rollout_id,
                model_call_id=call.model_call_id,
                parent_model_call_id=(
                    call.admission.parent_model_call_id if call.admission is not None else None
                ),
                parent_chain_hash=call._parent_chain_hash,
                prev_len=prev_len,
                token_ids=prompt_delta + generated,
                loss_mask=(0,) * len(prompt_delta) + (1,) * len(generated),
                logprobs=(0.0,) * len(prompt_delta) + logprobs,
                weight_version=call.weight_version,
                extras=extras,
            )
        except ValueError as exc:
            return self._fail(call, REASON_INVALID_INPUT, str(exc))

        try:
            if attachments is None:
                self.sink.stage(record)
            else:
                self.sink.stage(record, attachments=attachments)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TypeError) and attachments is not None:
                detail += " (does the sink's stage() take the attachments keyword?)"
            return self._fail(call, REASON_SINK_FAILED, detail)

        staged = _StagedCall(
            parent_model_call_id=record.parent_model_call_id,
            prev_len=record.prev_len,
            delta=array("Q", record.token_ids),
            chain_hash=record.chain_hash,
        )
        with self._lock:
            self._in_flight.pop(call.staging_key, None)
            self._remembered(call.rollout_id)[call.model_call_id] = staged
        return record.coords()

    # -- failure helpers -----------------------------------------------------------------------

    @staticmethod
    def _ids(call: object) -> tuple[str, str]:
        if isinstance(call, PendingCall):
            return call.rollout_id, call.model_call_id
        return "", ""

    def _release(self, call: object) -> None:
        if not isinstance(call, PendingCall):
            return
        with self._lock:
            if self._in_flight.get(call.staging_key) is call:
                del self._in_flight[call.staging_key]

    def _coords_failed(self, call: object, code: str, detail: str) -> CommitCoords:
        rollout_id, model_call_id = self._ids(call)
        coords = CommitCoords.failed(
            code,
            detail or "no detail",
            rollout_id=rollout_id,
            model_call_id=model_call_id,
        )
        logger.warning("token capture failed for %s: %s", coords.staging_key, coords.reason)
        return coords

    def _fail(self, call: object, code: str, detail: str) -> CommitCoords:
        self._release(call)
        return self._coords_failed(call, code, detail)
