"""Digests of staged calls: the byte encoding and the three SHA-256 hashes over it.

The encoding is specified in ``docs/staging-digest.md``, precisely enough to reimplement; the
golden vectors there are checked against this module by the tests. Every hash starts with its own
domain string, so a call digest can never be mistaken for an extras digest or a chain hash even
when their remaining bytes coincide; every variable-length field carries its length, so no two
different inputs share a preimage.

Token ids are encoded as uint64 and masks and logprobs as IEEE-754 binary32 bit patterns, all
big-endian. Values are validated before they are hashed (see ``_records``): the functions here
assume well-formed input, except the extras encoder, which refuses anything it cannot encode
one way only.
"""

from __future__ import annotations

import hashlib
import math
import struct
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CALL_DIGEST_DOMAIN",
    "CHAIN_HASH_DOMAIN",
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_DOMAIN",
    "ROOT_CHAIN_HASH",
    "call_digest",
    "chain_hash",
    "encode_extras",
    "encode_float32s",
    "encode_token_ids",
    "extras_digest",
    "is_digest_hex",
]

CALL_DIGEST_DOMAIN = "rollcap.staging.call.v1"
EXTRAS_DIGEST_DOMAIN = "rollcap.staging.extras.v1"
CHAIN_HASH_DOMAIN = "rollcap.staging.chain.v1"

# The parent chain hash of a call that has no parent: 32 zero bytes. No SHA-256 output is known
# to be all zeros, so a root can never be confused with a real parent.
ROOT_CHAIN_HASH = "0" * 64

_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_BIG_ENDIAN_HOST = sys.byteorder == "big"

_TAG_NULL = b"\x00"
_TAG_FALSE = b"\x01"
_TAG_TRUE = b"\x02"
_TAG_INT = b"\x03"
_TAG_FLOAT = b"\x04"
_TAG_STR = b"\x05"
_TAG_LIST = b"\x06"
_TAG_MAP = b"\x07"

_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
# Nesting deeper than this is refused rather than risking the interpreter's recursion limit.
_MAX_DEPTH = 64


def _u64(value: int) -> bytes:
    return _U64.pack(value)


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return _U64.pack(len(data)) + data


def _optional_text(value: str | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + _text(value)


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Count (uint64) then each id as uint64, big-endian."""
    packed = array("Q", token_ids)
    if not _BIG_ENDIAN_HOST:
        packed.byteswap()
    return _U64.pack(len(packed)) + packed.tobytes()


def encode_float32s(values: Sequence[float]) -> bytes:
    """Count (uint64) then each value's binary32 bit pattern, big-endian.

    Callers pass values that are exactly representable in binary32 (``_records`` checks), so
    the narrowing here never rounds.
    """
    packed = array("f", values)
    if not _BIG_ENDIAN_HOST:
        packed.byteswap()
    return _U64.pack(len(packed)) + packed.tobytes()


def _sha256_hex(domain: str, *parts: bytes) -> str:
    hasher = hashlib.sha256(_text(domain))
    for part in parts:
        hasher.update(part)
    return hasher.hexdigest()


def call_digest(
    *,
    rollout_id: str,
    model_call_id: str,
    parent_model_call_id: str | None,
    prev_len: int,
    weight_version: int,
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    logprobs: Sequence[float],
) -> str:
    """The digest of one staged call's identity, position and token delta (hex).

    ``prev_len`` is covered so that the digest alone pins where the delta sits in the chain;
    the identity fields are covered so that a record cannot be moved to another call unseen.
    """
    return _sha256_hex(
        CALL_DIGEST_DOMAIN,
        _text(rollout_id),
        _text(model_call_id),
        _optional_text(parent_model_call_id),
        _u64(prev_len),
        _u64(weight_version),
        encode_token_ids(token_ids),
        encode_float32s([float(m) for m in loss_mask]),
        encode_float32s(logprobs),
    )


def _encode_value(value: object, out: list[bytes], path: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"extras nested deeper than {_MAX_DEPTH} levels at {path}")
    # bool before int: bool is an int subclass, and True must not hash like 1.
    if value is None:
        out.append(_TAG_NULL)
    elif value is True:
        out.append(_TAG_TRUE)
    elif value is False:
        out.append(_TAG_FALSE)
    elif isinstance(value, int):
        if not _I64_MIN <= value <= _I64_MAX:
            raise ValueError(f"extras integer at {path} is outside the int64 range")
        out.append(_TAG_INT + _I64.pack(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"extras float at {path} is {value!r}: NaN and infinities are refused")
        out.append(_TAG_FLOAT + _F64.pack(value))
    elif isinstance(value, str):
        out.append(_TAG_STR + _text(value))
    elif isinstance(value, list | tuple):
        out.append(_TAG_LIST + _u64(len(value)))
        for index, item in enumerate(value):
            _encode_value(item, out, f"{path}[{index}]", depth + 1)
    elif isinstance(value, Mapping):
        _encode_map(value, out, path, depth)
    else:
        raise ValueError(
            f"extras value at {path} has type {type(value).__name__}: only null, bool, int, "
            "float, str, list and str-keyed maps can be staged",
        )


def _encode_map(value: Mapping[Any, Any], out: list[bytes], path: str, depth: int) -> None:
    keys: list[tuple[bytes, str]] = []
    for key in value:
        if not isinstance(key, str):
            raise ValueError(f"extras map at {path} has a non-string key {key!r}")
        keys.append((key.encode("utf-8"), key))
    keys.sort()
    out.append(_TAG_MAP + _u64(len(keys)))
    for encoded, key in keys:
        out.append(_U64.pack(len(encoded)) + encoded)
        _encode_value(value[key], out, f"{path}.{key}", depth + 1)


def encode_extras(extras: Mapping[str, object]) -> bytes:
    """The typed encoding of an extras map; ``ValueError`` for anything not encodable."""
    if not isinstance(extras, Mapping):
        raise ValueError(f"extras must be a map, not {type(extras).__name__}")
    out: list[bytes] = []
    try:
        _encode_map(extras, out, "extras", 0)
    except UnicodeEncodeError as exc:
        raise ValueError(f"extras hold a string that is not valid Unicode: {exc}") from None
    return b"".join(out)


def extras_digest(extras: Mapping[str, object]) -> str:
    return _sha256_hex(EXTRAS_DIGEST_DOMAIN, encode_extras(extras))


EMPTY_EXTRAS_DIGEST = extras_digest({})


def is_digest_hex(value: object) -> bool:
    """A digest in its one canonical spelling: 64 lowercase hex digits."""
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def chain_hash(*, parent_chain_hash: str, prev_len: int, digest: str, extras_digest: str) -> str:
    """Chain one call onto its parent: the parent's chain hash, prev_len and both digests."""
    return _sha256_hex(
        CHAIN_HASH_DOMAIN,
        bytes.fromhex(parent_chain_hash),
        _u64(prev_len),
        bytes.fromhex(digest),
        bytes.fromhex(extras_digest),
    )
