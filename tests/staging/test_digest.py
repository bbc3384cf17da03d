"""Every golden vector of STAGING §3.3-3.6, and the refusals of ``compute_staging_digest``."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from rollcap.staging._digest import (
    EMPTY_EXTRAS_DIGEST,
    compute_chain_hash,
    compute_extras_digest,
    compute_staging_digest,
    encode_extras,
    encode_float32s,
    encode_token_ids,
    hash_token_ids,
    is_hex64,
)

# STAGING §3.4: the vectors NeMo Gym 0.7.0 ships in its conformance package.
SHIPPED_EXTRAS = {"routed_experts": [[[1, 2]], [[3, 4]]]}
SHIPPED_EXTRAS_DIGEST = "032024e899456be6e9a78c6d0399c5112d2ca7fa18d4ea9cf0d8cb7d0094f3a3"
SHIPPED_CALL: dict[str, Any] = {
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "rollout_id": "rollout-1",
    "model_call_id": "call-1",
    "parent_call_id": "parent-1",
    "mode": "token_in",
    "prev_len": 3,
    "delta_len": 2,
    "cum_len": 5,
    "weight_version": 7,
    "token_ids_delta": [10, 11],
    "token_mask_delta": [0.0, 1.0],
    "generation_log_probs_delta": [0.0, -0.25],
    "extras_digest": SHIPPED_EXTRAS_DIGEST,
    "chain_hash": "1" * 64,
    "cumulative_hash": "2" * 64,
}
SHIPPED_CALL_DIGEST = "1122c7fe7e914c809eb9b1c09b26d94a50c1eb2790e7430fbcd8363b846ccf27"

ROOT: dict[str, Any] = {
    "schema_version": 2,
    "digest_version": 2,
    "extras_digest_version": 1,
    "rollout_id": "0-0",
    "model_call_id": "0a1b",
    "parent_call_id": None,
    "mode": "text",
    "prev_len": 0,
    "delta_len": 5,
    "cum_len": 5,
    "weight_version": 7,
    "token_ids_delta": [1, 104, 105, 42, 2],
    "token_mask_delta": [0.0, 0.0, 0.0, 1.0, 1.0],
    "generation_log_probs_delta": [0.0, 0.0, 0.0, -0.5, -1.25],
    "extras_digest": EMPTY_EXTRAS_DIGEST,
    "chain_hash": "e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6",
    "cumulative_hash": "f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0",
}
ROOT_DIGEST = "45abfc67c351e4e4dd43b42c9cbefedd1c4c79d12864609d6706b6219ed1313d"
# STAGING §3.5: the root digest's preimage, field by field.
ROOT_PREIMAGE = "".join(
    line.split("#")[0].replace(" ", "")
    for line in """
6e656d6f2d67796d2d73746167696e672d63616c6c2d7632
02 02 01
0000000000000003 302d30
0000000000000004 30613162
00
0000000000000004 74657874
0000000000000000 0000000000000005 0000000000000005 0000000000000007
0000000000000030
0000000000000005 0000000000000001 0000000000000068 0000000000000069
000000000000002a 0000000000000002
000000000000001c 0000000000000005 00000000 00000000 00000000 3f800000 3f800000
000000000000001c 0000000000000005 00000000 00000000 00000000 bf000000 bfa00000
a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6
01 e606f3fac05e3eaa16232343e63807f62088cf8a2fb8c0140de69d82e5a289e6
01 f068b6cf29511f34cf31a38e89e396bf66de10d8ba764f2ed4b95865026fb4f0
""".strip().splitlines()
)


def test_the_shipped_golden_vectors() -> None:
    assert compute_extras_digest(SHIPPED_EXTRAS) == SHIPPED_EXTRAS_DIGEST
    assert compute_staging_digest(**SHIPPED_CALL) == SHIPPED_CALL_DIGEST


def test_the_root_digest_and_its_preimage() -> None:
    assert hashlib.sha256(bytes.fromhex(ROOT_PREIMAGE)).hexdigest() == ROOT_DIGEST
    assert compute_staging_digest(**ROOT) == ROOT_DIGEST
    assert compute_chain_hash(None, ROOT["token_ids_delta"]) == ROOT["chain_hash"]
    assert hash_token_ids(ROOT["token_ids_delta"]) == ROOT["cumulative_hash"]


def test_the_record_fields_that_are_not_digested_are_accepted_and_ignored() -> None:
    assert compute_staging_digest(**ROOT, digest="0" * 64, extras=None) == ROOT_DIGEST


def test_the_smaller_vectors() -> None:
    assert encode_token_ids([0, 1, 300, 2**64 - 1]).hex() == (
        "000000000000000400000000000000000000000000000001000000000000012cffffffffffffffff"
    )
    assert hash_token_ids([]) == (
        "17088fc6f8fd317bf02bd83e106f7ca2dfb7b9cfc63927c2387d4c87f29578ef"
    )
    assert hash_token_ids([1, 2, 3]) == (
        "4684ad7ad2412b902ad240cdfb11427345d0ff81f93cacabeb48914a4ea9e32e"
    )
    chain = compute_chain_hash(None, [1, 2, 3])
    assert chain == "48e57a14b92bae4715336b34ecfc6570ae173a5248b845655d1446592c7c26c6"
    assert compute_chain_hash(chain, [4, 5]) == (
        "64331b75313b5ac2083d786ede9ede247c96fbab1e04936effd04b22888993ab"
    )


def test_the_extras_encoding_vector() -> None:
    extras = {"b": [1, 1.0, True, False, None, "é"], "a": {"n": -2}}
    assert (b"\x01" + encode_extras(extras)).hex() == (
        "0144000000000000000200000000000000016144000000000000000100000000000000016e49ffffffff"
        "fffffffe0000000000000001624c0000000000000006490000000000000001463ff00000000000004201"
        "42004e530000000000000002c3a9"
    )
    assert compute_extras_digest(extras) == (
        "b92686260f01b42031b66cf9c003e6a2e53ea22bfdd2f070c687dc1082bce97f"
    )


def test_null_and_empty_extras_differ() -> None:
    assert EMPTY_EXTRAS_DIGEST == (
        "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6"
    )
    assert compute_extras_digest({}) == (
        "1fd859b283c766e508af525e02edd53f1861163b644f36caccdb8b2316f52e77"
    )


@pytest.mark.parametrize(
    "value",
    [(1, 2), b"x", float("nan"), float("inf"), 2**63, -(2**63) - 1, {1: "a"}, {1.5}],
    ids=["tuple", "bytes", "nan", "inf", "big", "small", "int-key", "set"],
)
def test_extras_without_one_encoding_are_refused(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        compute_extras_digest({"v": value})


def test_extras_keys_sort_by_their_utf8_bytes() -> None:
    # By UTF-8 bytes "\uffff" (ef bf bf) comes before "𐀀" (f0 90 80 80), whatever the order
    # the keys were given in; a UTF-16 ordering (as some JSON canonicalizers use) would differ.
    assert encode_extras({"𐀀": 1, "\uffff": 2}) == encode_extras({"\uffff": 2, "𐀀": 1})
    body = encode_extras({"𐀀": 1, "\uffff": 2})
    assert body.index("\uffff".encode()) < body.index("𐀀".encode())


def test_logprobs_with_one_float32_value_digest_alike() -> None:
    a = {**SHIPPED_CALL, "generation_log_probs_delta": [0.0, -0.1]}
    b = {**SHIPPED_CALL, "generation_log_probs_delta": [0.0, -0.10000000149011612]}
    assert compute_staging_digest(**a) == compute_staging_digest(**b)


def test_negative_zero_passes_the_carry_rule_but_changes_the_digest() -> None:
    negative = {**SHIPPED_CALL, "generation_log_probs_delta": [-0.0, -0.25]}
    assert compute_staging_digest(**negative) != SHIPPED_CALL_DIGEST


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"schema_version": 1}, "schema_version"),
        ({"digest_version": True}, "digest_version"),
        ({"extras_digest_version": 1.0}, "extras_digest_version"),
        ({"rollout_id": ""}, "rollout_id"),
        ({"model_call_id": ""}, "model_call_id"),
        ({"parent_call_id": ""}, "parent_call_id"),
        ({"mode": "tokens"}, "mode"),
        ({"parent_call_id": None}, "root"),
        ({"mode": "text"}, "child"),
        ({"prev_len": 0}, "child"),
        ({"delta_len": 0}, "delta_len must be > 0"),
        ({"delta_len": 3, "cum_len": 6}, "number of token ids"),
        ({"token_mask_delta": [0.0]}, "one length"),
        ({"token_mask_delta": [0.5, 1.0]}, "0.0 or 1.0"),
        ({"generation_log_probs_delta": [-0.5, -0.25]}, "carry logprob"),
        ({"cum_len": 6}, "cum_len"),
        ({"extras_digest": "A" * 64}, "extras_digest"),
        ({"chain_hash": "1" * 63}, "chain_hash"),
        ({"weight_version": -1}, "weight_version"),
    ],
)
def test_the_digest_refuses_what_a_record_must_never_hold(
    change: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        compute_staging_digest(**{**SHIPPED_CALL, **change})


def test_a_carry_logprob_that_is_no_float_is_refused_as_such() -> None:
    with pytest.raises(TypeError, match="generation_log_probs_delta 0 must be a float"):
        compute_staging_digest(**{**SHIPPED_CALL, "generation_log_probs_delta": ["x", -0.25]})


def test_long_columns_are_checked_whole_and_name_the_culprit() -> None:
    n = 40_000
    ids = list(range(n))
    call = {
        **SHIPPED_CALL,
        "prev_len": 3,
        "delta_len": n,
        "cum_len": n + 3,
        "token_ids_delta": ids,
        "token_mask_delta": [0.0] * (n - 1) + [1.0],
        "generation_log_probs_delta": [0.0] * (n - 1) + [-0.5],
    }
    assert is_hex64(compute_staging_digest(**call))
    logprobs = list(call["generation_log_probs_delta"])
    logprobs[39_000] = -1.0
    with pytest.raises(ValueError, match=r"carry logprob 39000 must be 0\.0"):
        compute_staging_digest(**{**call, "generation_log_probs_delta": logprobs})
    with pytest.raises(ValueError, match="token id 123 must be in"):
        compute_staging_digest(**{**call, "token_ids_delta": [*ids[:123], -1, *ids[124:]]})


def test_an_int_logprob_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a float"):
        encode_float32s([0.0, -1], "generation_log_probs_delta")


def test_floats_outside_float32_are_refused() -> None:
    with pytest.raises(ValueError, match="float32 range"):
        encode_float32s([1e39])


def test_ids_outside_u64_are_refused() -> None:
    with pytest.raises(ValueError, match="token id 1"):
        encode_token_ids([1, 2**64])
    with pytest.raises(ValueError, match="token id 0"):
        encode_token_ids([True])


def test_is_hex64() -> None:
    assert is_hex64("a" * 64)
    assert not is_hex64("a" * 64 + "\n")
    assert not is_hex64(None)
