from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from rollcap.gym import RESOURCES_SERVERS, example_data_path

CHECKOUT = Path(__file__).resolve().parents[2] / "resources_servers"


@pytest.mark.parametrize("name", ["mcqa", "calculator"])
def test_the_packaged_example_is_there_and_is_json_lines(name: str) -> None:
    path = example_data_path(name)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    assert lines
    assert all("responses_create_params" in line for line in lines)


@pytest.mark.parametrize("name", sorted(RESOURCES_SERVERS))
def test_every_resources_server_ships_its_checkout_example_byte_for_byte(name: str) -> None:
    in_checkout = CHECKOUT / name / "data" / "example.jsonl"
    assert example_data_path(name).read_bytes() == in_checkout.read_bytes()


def test_an_unknown_resources_server_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: calculator, mcqa"):
        example_data_path("nope")
