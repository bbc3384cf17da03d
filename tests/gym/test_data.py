from __future__ import annotations

import orjson
import pytest

from rollcap.gym import example_data_path


def test_the_packaged_mcqa_example_is_there_and_is_json_lines() -> None:
    path = example_data_path("mcqa")
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    assert lines
    assert all("responses_create_params" in line for line in lines)


def test_an_unknown_resources_server_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: mcqa"):
        example_data_path("nope")
