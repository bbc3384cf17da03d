"""Example task files shipped inside the package, so they are there in any install."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["EXAMPLE_DATA", "example_data_path"]

# Resources server name -> its example file under rollcap/gym/data/.
EXAMPLE_DATA = {"calculator": "calculator/example.jsonl", "mcqa": "mcqa/example.jsonl"}


def example_data_path(name: str) -> Path:
    """The packaged example JSONL of resources server ``name`` (``KeyError`` if it has none)."""
    if name not in EXAMPLE_DATA:
        known = ", ".join(sorted(EXAMPLE_DATA))
        raise KeyError(f"no example data for resources server {name!r} (known: {known})")
    resource = resources.files("rollcap.gym").joinpath("data", *EXAMPLE_DATA[name].split("/"))
    # Installed from a wheel or a checkout the package is a directory; a zipped install would
    # need as_file(), and rollcap's wheel is never zip-imported.
    path = Path(str(resource))
    if not path.is_file():
        raise FileNotFoundError(f"example data for {name!r} is missing from the install: {path}")
    return path
