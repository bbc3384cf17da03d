"""Freeze the public names of rollcap.worker, and keep it off the model server's modules."""

from __future__ import annotations

import ast
from pathlib import Path

import rollcap.worker


def test_public_names() -> None:
    assert set(rollcap.worker.__all__) == {"WorkerSettings", "create_worker_app"}
    for name in rollcap.worker.__all__:
        assert getattr(rollcap.worker, name).__module__.startswith("rollcap.worker._")


def test_the_worker_stands_apart_from_the_servers_and_the_cli() -> None:
    package = Path(rollcap.worker.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(
                    ("rollcap.server", "rollcap.gym", "rollcap.cli", "rollcap.store")
                ), f"{path.name} imports {node.module}"
