"""The staging digests: the byte encodings and the four SHA-256 hashes of NeMo Gym 0.7.0.

Every hash starts with its own raw ASCII domain and hashes a body built from length-prefixed
fields (STAGING §3), so a digest of one kind can never be mistaken for another and no two
different inputs share a preimage. Integers are big-endian; token ids are uint64; masks and
logprobs are hashed as their IEEE-754 binary32 bit patterns (the stored value keeps float64, so
two logprobs with one float32 value digest alike); extras floats as binary64.

The golden vectors of STAGING §3.4-3.6 are reproduced by ``tests/staging/test_digest.py``.
"""

from __future__ import annotations

import hashlib
import math
import operator
import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import repeat
from typing import Any

__all__ = [
    "CALL_DIGEST_DOMAIN",
    "CHAIN_HASH_DOMAIN",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_DOMAIN",
    "EXTRAS_DIGEST_VERSION",
    "PREFIX_HASH_DOMAIN",
    "STAGING_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "compute_chain_hash",
    "compute_extras_digest",
    "compute_staging_digest",
    "encode_extras",
    "encode_float32s",
    "encode_token_ids",
    "hash_token_ids",
    "is_hex64",
]

STAGING_SCHEMA_VERSION = 2
STAGING_DIGEST_VERSION = 2
EXTRAS_DIGEST_VERSION = 1

CALL_DIGEST_DOMAIN = b"nemo-gym-staging-call-v2"
EXTRAS_DIGEST_DOMAIN = b"nemo-gym-staging-extras-v1"
CHAIN_HASH_DOMAIN = b"nemo-gym-staging-chain-v1"
PREFIX_HASH_DOMAIN = b"nemo-gym-staging-prefix-v2"

_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_F32_MAX = 3.4028234663852886e38
_HEX = frozenset("0123456789abcdef")
# Nesting deeper than this is refused rather than risking the interpreter's recursion limit
# (0.7.0 has no limit of its own but that one, about a thousand levels).
_MAX_DEPTH = 512
# The presence marker before the chain and cumulative hashes: frozen at 1 by the format.
_PRESENT = b"\x01"


def is_hex64(value: object) -> bool:
    """Whether ``value`` is 64 lowercase hex digits (a SHA-256 as the wire writes it)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def _exact_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {type(value).__name__}")
    return value


def _u64(value: object, name: str) -> bytes:
    number = _exact_int(value, name)
    if not 0 <= number <= _U64_MAX:
        raise ValueError(f"{name} must be in 0..2**64-1, not {number}")
    return _U64.pack(number)


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _U64.pack(len(data)) + data


def _bytes(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


def encode_token_ids(ids: Sequence[int]) -> bytes:
    """``u64(count)`` then each id as ``u64``; ``ValueError`` for a non-int or out-of-range id."""
    # The type test over set(map(type, ...)) and the range test inside array run in C: prompts
    # run to tens of thousands of ids, and a Python loop over them holds the interpreter lock
    # for milliseconds per call. The slow path only finds the culprit for the message.
    if set(map(type, ids)) - {int}:
        bad = next(i for i, v in enumerate(ids) if type(v) is not int)
        raise ValueError(f"token id {bad} must be an integer, not {type(ids[bad]).__name__}")
    try:
        packed = array("Q", ids)
    except OverflowError:
        bad = next(i for i, v in enumerate(ids) if not 0 <= v <= _U64_MAX)
        raise ValueError(f"token id {bad} must be in 0..2**64-1, not {ids[bad]}") from None
    if not _BIG_ENDIAN_HOST:
        packed.byteswap()
    return _U64.pack(len(ids)) + packed.tobytes()


def encode_float32s(values: Sequence[float], name: str = "value") -> bytes:
    """``u64(count)`` then each value's binary32 pattern; exact, finite, in range floats only."""
    # As for the ids: the checks run in C, the loops only name the culprit.
    if set(map(type, values)) - {float}:
        bad = next(i for i, v in enumerate(values) if type(v) is not float)
        raise TypeError(f"{name} {bad} must be a float, not {type(values[bad]).__name__}")
    if not all(map(math.isfinite, values)) or (values and max(map(abs, values)) > _F32_MAX):
        bad = next(i for i, v in enumerate(values) if not math.isfinite(v) or abs(v) > _F32_MAX)
        raise ValueError(f"{name} {bad} must be finite and within float32 range: {values[bad]}")
    packed = array("f", values)
    if not _BIG_ENDIAN_HOST:
        packed.byteswap()
    return _U64.pack(len(values)) + packed.tobytes()


def hash_token_ids(ids: Sequence[int]) -> str:
    """The prefix hash of a full id sequence (a record's ``cumulative_hash``)."""
    return hashlib.sha256(PREFIX_HASH_DOMAIN + encode_token_ids(ids)).hexdigest()


def compute_chain_hash(parent_chain_hash: str | None, token_ids_delta: Sequence[int]) -> str:
    """A call's chain hash: its parent's (none for a root) extended by its own delta ids."""
    if parent_chain_hash is None:
        link = b"\x00"
    elif is_hex64(parent_chain_hash):
        link = b"\x01" + bytes.fromhex(parent_chain_hash)
    else:
        raise ValueError("parent_chain_hash must be 64 lowercase hex digits")
    return hashlib.sha256(CHAIN_HASH_DOMAIN + link + encode_token_ids(token_ids_delta)).hexdigest()


def encode_extras(value: object) -> bytes:
    """The tagged encoding of an extras value (STAGING §3.3); ``ValueError``/``TypeError`` for
    anything that has no single encoding (tuples, bytes, NaN, big ints, non-string keys)."""
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _encode(value: object, out: bytearray, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"extras nest deeper than {_MAX_DEPTH} levels")
    kind = type(value)
    if value is None:
        out += b"N"
    elif kind is bool:
        out += b"B\x01" if value else b"B\x00"
    elif kind is int:
        assert isinstance(value, int)
        if not _I64_MIN <= value <= _I64_MAX:
            raise ValueError(f"an extras integer must fit in signed 64 bits: {value}")
        out += b"I" + _I64.pack(value)
    elif kind is float:
        assert isinstance(value, float)
        if not math.isfinite(value):
            raise ValueError(f"an extras float must be finite: {value}")
        out += b"F" + _F64.pack(value)
    elif kind is str:
        assert isinstance(value, str)
        out += b"S" + _text(value)
    elif kind is list:
        assert isinstance(value, list)
        out += b"L" + _U64.pack(len(value))
        for item in value:
            _encode(item, out, depth + 1)
    elif kind is dict:
        assert isinstance(value, dict)
        for key in value:
            if type(key) is not str:
                raise TypeError(f"extras keys must be strings, not {type(key).__name__}")
        out += b"D" + _U64.pack(len(value))
        for key in sorted(value, key=lambda k: k.encode("utf-8")):
            out += _text(key)
            _encode(value[key], out, depth + 1)
    else:
        raise TypeError(f"extras cannot hold a {kind.__name__}")


def compute_extras_digest(extras: object) -> str:
    """The digest of a call's extras, null or an object (``TypeError`` otherwise); null and
    ``{}`` differ."""
    if extras is not None and type(extras) is not dict:
        raise TypeError(f"extras must be an object or null, not {type(extras).__name__}")
    body = bytes([EXTRAS_DIGEST_VERSION]) + encode_extras(extras)
    return hashlib.sha256(EXTRAS_DIGEST_DOMAIN + body).hexdigest()


EMPTY_EXTRAS_DIGEST = compute_extras_digest(None)


_MASK_VALUES = frozenset((0.0, 1.0))


def _carry_logprob(mask: float, logprob: object) -> bool:
    """Whether a carry token (mask 0.0) has a float logprob other than 0.0 (a value that is no
    float is the float encoding's to refuse)."""
    return mask == 0.0 and type(logprob) is float and logprob != 0.0


def _carry_is_not_zero(masks: Sequence[float], logprobs: Sequence[float]) -> bool:
    """Whether some carry token (mask 0.0) has a logprob other than 0.0, for masks already
    known to be 0.0 or 1.0: ``(1.0 - mask) * logprob`` is non-zero exactly there. In C."""
    try:
        return any(map(operator.mul, map(operator.sub, repeat(1.0), masks), logprobs))
    except TypeError:
        # A logprob that is not a number: the rule by hand, so the float encoding below is what
        # refuses it, with its own message.
        return any(map(_carry_logprob, masks, logprobs))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _version(value: object, expected: int, name: str) -> None:
    _require(
        not isinstance(value, bool) and isinstance(value, int) and value == expected,
        f"{name} must be {expected}, not {value!r}",
    )


def compute_staging_digest(
    *,
    schema_version: int,
    digest_version: int,
    extras_digest_version: int,
    rollout_id: str,
    model_call_id: str,
    parent_call_id: str | None,
    mode: str,
    prev_len: int,
    delta_len: int,
    cum_len: int,
    weight_version: int,
    token_ids_delta: Sequence[int],
    token_mask_delta: Sequence[float],
    generation_log_probs_delta: Sequence[float],
    extras_digest: str,
    chain_hash: str,
    cumulative_hash: str,
    **ignored: Any,
) -> str:
    """The call digest over a staged record's fields 1-18 (STAGING §3.2).

    Refuses (``ValueError``; ``TypeError`` for a value that is not a float in a float column)
    before hashing whatever a record must never hold: other versions,
    empty ids, a root that is not ``text`` at 0 or a child that is not ``token_in`` past 0, an
    empty or mis-sized delta, unequal columns, a mask other than 0.0/1.0, a non-zero carry
    logprob, ``cum_len`` other than ``prev_len + delta_len``, a malformed hash. Keywords other
    than the digested fields (``digest``, ``extras``) are accepted and ignored, so a record's
    whole JSON can be passed.
    """
    _version(schema_version, STAGING_SCHEMA_VERSION, "schema_version")
    _version(digest_version, STAGING_DIGEST_VERSION, "digest_version")
    _version(extras_digest_version, EXTRAS_DIGEST_VERSION, "extras_digest_version")
    for name, value in (("rollout_id", rollout_id), ("model_call_id", model_call_id)):
        _require(isinstance(value, str) and value != "", f"{name} must be a non-empty string")
    _require(
        parent_call_id is None or (isinstance(parent_call_id, str) and parent_call_id != ""),
        "parent_call_id must be null or a non-empty string",
    )
    _require(mode in ("text", "token_in"), f"mode must be text or token_in, not {mode!r}")
    prev = _exact_int(prev_len, "prev_len")
    if parent_call_id is None:
        _require(mode == "text" and prev == 0, "a root call must be mode text with prev_len 0")
    else:
        _require(mode == "token_in" and prev > 0, "a child call must be token_in with prev_len > 0")
    delta = _exact_int(delta_len, "delta_len")
    _require(delta > 0, "delta_len must be > 0")
    _require(delta == len(token_ids_delta), "delta_len must equal the number of token ids")
    _require(
        len(token_mask_delta) == delta and len(generation_log_probs_delta) == delta,
        "token_ids_delta, token_mask_delta and generation_log_probs_delta must have one length",
    )
    # In C, not a Python loop per token (see encode_token_ids). Non-numbers in either column
    # fail the float encoding below.
    if not set(token_mask_delta) <= _MASK_VALUES:
        bad = next(i for i, m in enumerate(token_mask_delta) if m not in _MASK_VALUES)
        raise ValueError(f"token_mask_delta {bad} must be 0.0 or 1.0")
    if _carry_is_not_zero(token_mask_delta, generation_log_probs_delta):
        bad = next(
            i
            for i, (m, lp) in enumerate(
                zip(token_mask_delta, generation_log_probs_delta, strict=True)
            )
            if _carry_logprob(m, lp)
        )
        raise ValueError(f"carry logprob {bad} must be 0.0")
    _require(_exact_int(cum_len, "cum_len") == prev + delta, "cum_len must be prev_len + delta_len")
    for name, value in (
        ("extras_digest", extras_digest),
        ("chain_hash", chain_hash),
        ("cumulative_hash", cumulative_hash),
    ):
        _require(is_hex64(value), f"{name} must be 64 lowercase hex digits")
    body = b"".join(
        (
            CALL_DIGEST_DOMAIN,
            bytes((STAGING_SCHEMA_VERSION, STAGING_DIGEST_VERSION, EXTRAS_DIGEST_VERSION)),
            _text(rollout_id),
            _text(model_call_id),
            b"\x00" if parent_call_id is None else b"\x01" + _text(parent_call_id),
            _text(mode),
            _u64(prev, "prev_len"),
            _u64(delta, "delta_len"),
            _u64(cum_len, "cum_len"),
            _u64(weight_version, "weight_version"),
            _bytes(encode_token_ids(token_ids_delta)),
            _bytes(encode_float32s(token_mask_delta, "token_mask_delta")),
            _bytes(encode_float32s(generation_log_probs_delta, "generation_log_probs_delta")),
            bytes.fromhex(extras_digest),
            _PRESENT + bytes.fromhex(chain_hash),
            _PRESENT + bytes.fromhex(cumulative_hash),
        )
    )
    return hashlib.sha256(body).hexdigest()
