"""Digests: golden vectors from docs/staging-digest.md, an independent reimplementation of the
spec, and the refusals that keep one value to one encoding."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollcap.staging import EMPTY_EXTRAS_DIGEST, ROOT_CHAIN_HASH, StagedCallRecord
from rollcap.staging import _digest as digest

DOC = Path(__file__).resolve().parents[2] / "docs" / "staging-digest.md"

# The same values as the doc's vectors, written here too so that a change to either is seen.
GOLDEN = {
    "encode_token_ids": "000000000000000400000000000000000000000000000001000000000000012c"
    "ffffffffffffffff",
    "encode_float32s": "0000000000000004000000003f800000bf000000bfa00000",
    "extras_empty": "7f8367d63fbca2c5f2fa5ea37b6233b96c97a5daf69c360843189c13e689ffba",
    "extras_typed": "1de57589974e1a1a9ade6fca2c1b0206807ee5b04f0a7717c4126ae76da8c5f9",
    "root_digest": "a708072f635222af300539281747937c6ccfc90cb7f36db9128aa6fc9fec61e0",
    "root_chain": "746814600bbae45fde925eb8a293d97fcfd425038fc93b624d38cef759f24d77",
    "child_digest": "4eec50e9a783b1bca5d5c1e206b7213eafbee45f58273c52e21fe2ab4dcf646a",
    "child_extras": "84c7884bfd75d7236a82d7458781679a5a970d4024ab2197da065366e5221f9d",
    "child_chain": "71cf22b0f6f4fa6614402eaa0c33e2c004012bc8d52344218d954ee823fd2df0",
}


def _doc_block(name: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    block = text.split(f"<!-- {name}:begin -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
    return "\n".join(line for line in block.strip().splitlines() if not line.startswith("```"))


def _doc_vectors() -> dict[str, Any]:
    vectors: dict[str, Any] = json.loads(_doc_block("golden-vectors"))
    return vectors


def _doc_preimage(name: str) -> bytes:
    lines = [line.split("#", 1)[0] for line in _doc_block(name).splitlines()]
    return bytes.fromhex("".join("".join(line.split()) for line in lines))


# -- an independent implementation of the spec, element by element with struct ---------------


def ref_u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def ref_text(s: str) -> bytes:
    b = s.encode("utf-8")
    return ref_u64(len(b)) + b


def ref_ids(xs: list[int]) -> bytes:
    return ref_u64(len(xs)) + b"".join(struct.pack(">Q", x) for x in xs)


def ref_f32s(xs: list[float]) -> bytes:
    return ref_u64(len(xs)) + b"".join(struct.pack(">f", x) for x in xs)


def ref_value(v: Any) -> bytes:
    if v is None:
        return b"\x00"
    if v is False:
        return b"\x01"
    if v is True:
        return b"\x02"
    if isinstance(v, int):
        return b"\x03" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\x04" + struct.pack(">d", v)
    if isinstance(v, str):
        return b"\x05" + ref_text(v)
    if isinstance(v, list):
        return b"\x06" + ref_u64(len(v)) + b"".join(ref_value(x) for x in v)
    keys = sorted(v, key=lambda k: k.encode("utf-8"))
    return b"\x07" + ref_u64(len(keys)) + b"".join(ref_text(k) + ref_value(v[k]) for k in keys)


def ref_hash(domain: str, body: bytes) -> str:
    return hashlib.sha256(ref_text(domain) + body).hexdigest()


def ref_call_digest(r: dict[str, Any]) -> str:
    parent = r["parent_model_call_id"]
    return ref_hash(
        "rollcap.staging.call.v1",
        ref_text(r["rollout_id"])
        + ref_text(r["model_call_id"])
        + (b"\x00" if parent is None else b"\x01" + ref_text(parent))
        + ref_u64(r["prev_len"])
        + ref_u64(r["weight_version"])
        + ref_ids(r["token_ids"])
        + ref_f32s([float(m) for m in r["loss_mask"]])
        + ref_f32s(r["logprobs"]),
    )


def ref_chain(parent: str, prev_len: int, call: str, extras: str) -> str:
    body = bytes.fromhex(parent) + ref_u64(prev_len) + bytes.fromhex(call) + bytes.fromhex(extras)
    return ref_hash("rollcap.staging.chain.v1", body)


# -- golden vectors ---------------------------------------------------------------------------


def test_doc_vectors_match_the_pinned_values() -> None:
    v = _doc_vectors()
    assert v["encode_token_ids"]["hex"] == GOLDEN["encode_token_ids"]
    assert v["encode_float32s"]["hex"] == GOLDEN["encode_float32s"]
    assert v["extras_empty"]["extras_digest"] == GOLDEN["extras_empty"]
    assert v["extras_typed"]["extras_digest"] == GOLDEN["extras_typed"]
    assert v["root_call"]["digest"] == GOLDEN["root_digest"]
    assert v["root_call"]["chain_hash"] == GOLDEN["root_chain"]
    assert v["child_call"]["digest"] == GOLDEN["child_digest"]
    assert v["child_call"]["extras_digest"] == GOLDEN["child_extras"]
    assert v["child_call"]["chain_hash"] == GOLDEN["child_chain"]


def test_encodings_match_the_doc_vectors() -> None:
    v = _doc_vectors()
    assert (
        digest.encode_token_ids(v["encode_token_ids"]["input"]).hex() == GOLDEN["encode_token_ids"]
    )
    assert digest.encode_float32s(v["encode_float32s"]["input"]).hex() == GOLDEN["encode_float32s"]
    for name in ("extras_empty", "extras_typed"):
        vector = v[name]
        assert digest.encode_extras(vector["extras"]).hex() == vector["encoding_hex"]
        assert ref_value(vector["extras"]).hex() == vector["encoding_hex"]
        assert digest.extras_digest(vector["extras"]) == vector["extras_digest"]
    assert GOLDEN["extras_empty"] == EMPTY_EXTRAS_DIGEST


@pytest.mark.parametrize("name", ["root_call", "child_call"])
def test_call_vectors_match_the_code_and_the_reference(name: str) -> None:
    vector = _doc_vectors()[name]
    record = StagedCallRecord.create(
        rollout_id=vector["rollout_id"],
        model_call_id=vector["model_call_id"],
        parent_model_call_id=vector["parent_model_call_id"],
        parent_chain_hash=vector["parent_chain_hash"],
        prev_len=vector["prev_len"],
        token_ids=vector["token_ids"],
        loss_mask=vector["loss_mask"],
        logprobs=vector["logprobs"],
        weight_version=vector["weight_version"],
        extras=vector["extras"],
    )
    assert record.digest == vector["digest"] == ref_call_digest(vector)
    assert record.extras_digest == vector["extras_digest"]
    assert (
        ref_hash("rollcap.staging.extras.v1", ref_value(vector["extras"]))
        == (vector["extras_digest"])
    )
    assert record.chain_hash == vector["chain_hash"]
    assert vector["chain_hash"] == ref_chain(
        vector["parent_chain_hash"],
        vector["prev_len"],
        vector["digest"],
        vector["extras_digest"],
    )


def test_child_vector_chains_onto_the_root_vector() -> None:
    v = _doc_vectors()
    assert v["root_call"]["parent_chain_hash"] == ROOT_CHAIN_HASH
    assert v["child_call"]["parent_chain_hash"] == v["root_call"]["chain_hash"]
    assert v["child_call"]["prev_len"] == len(v["root_call"]["token_ids"])


def test_doc_preimages_hash_to_the_root_vector() -> None:
    digest_preimage = _doc_preimage("root-digest-preimage")
    chain_preimage = _doc_preimage("root-chain-preimage")
    assert hashlib.sha256(digest_preimage).hexdigest() == GOLDEN["root_digest"]
    assert hashlib.sha256(chain_preimage).hexdigest() == GOLDEN["root_chain"]


# -- one value, one encoding ------------------------------------------------------------------


@pytest.mark.parametrize(
    "extras",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": [-math.inf]},
        {"x": 2**63},
        {"x": -(2**63) - 1},
        {"x": b"bytes"},
        {"x": {1, 2}},
        {1: "non-string key"},
        {"x": {"y": object()}},
        {"x": "\ud800"},
    ],
)
def test_extras_that_cannot_be_encoded_one_way_are_refused(extras: dict[Any, Any]) -> None:
    with pytest.raises(ValueError, match="extras"):
        digest.encode_extras(extras)


def test_extras_nesting_is_bounded() -> None:
    deep: Any = 0
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ValueError, match="deeper"):
        digest.encode_extras({"x": deep})


def test_extras_types_are_distinguished_and_key_order_is_not() -> None:
    digests = {digest.extras_digest({"x": v}) for v in (1, 1.0, True, "1", [1], None, 0.0, -0.0)}
    assert len(digests) == 8
    assert digest.extras_digest({"a": 1, "b": 2}) == digest.extras_digest({"b": 2, "a": 1})
    # Tuples are lists: extras come back from JSON as lists.
    assert digest.extras_digest({"a": (1, 2)}) == digest.extras_digest({"a": [1, 2]})


def test_each_hash_has_its_own_domain() -> None:
    assert (
        len({digest.CALL_DIGEST_DOMAIN, digest.EXTRAS_DIGEST_DOMAIN, digest.CHAIN_HASH_DOMAIN}) == 3
    )
    assert hashlib.sha256(b"").hexdigest() != EMPTY_EXTRAS_DIGEST


# -- properties -------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
extras_maps = st.dictionaries(st.text(max_size=6), json_values, max_size=5)
float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(extras=extras_maps)
def test_extras_digest_matches_the_reference_and_survives_json(extras: dict[str, Any]) -> None:
    expected = ref_hash("rollcap.staging.extras.v1", ref_value(extras))
    assert digest.extras_digest(extras) == expected
    assert digest.extras_digest(orjson.loads(orjson.dumps(extras))) == expected


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=20),
    generated=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2**64 - 1), float32s), max_size=20
    ),
    prev_len=st.integers(min_value=0, max_value=2**63),
    weight_version=st.integers(min_value=0, max_value=2**64 - 1),
    parent=st.none() | st.text(alphabet="0123456789abcdef", min_size=1, max_size=64),
    extras=extras_maps,
)
def test_record_digests_match_the_reference(
    prompt: list[int],
    generated: list[tuple[int, float]],
    prev_len: int,
    weight_version: int,
    parent: str | None,
    extras: dict[str, Any],
) -> None:
    fields: dict[str, Any] = {
        "rollout_id": "7-3-a1",
        "model_call_id": "beef",
        "parent_model_call_id": parent,
        "prev_len": prev_len,
        "weight_version": weight_version,
        "token_ids": prompt + [t for t, _ in generated],
        "loss_mask": [0] * len(prompt) + [1] * len(generated),
        "logprobs": [0.0] * len(prompt) + [lp for _, lp in generated],
    }
    record = StagedCallRecord.create(parent_chain_hash=ROOT_CHAIN_HASH, extras=extras, **fields)
    assert record.digest == ref_call_digest(fields)
    assert record.chain_hash == ref_chain(
        ROOT_CHAIN_HASH, prev_len, record.digest, record.extras_digest
    )
    again = StagedCallRecord.from_json(orjson.loads(orjson.dumps(record.to_json())))
    assert again == record
