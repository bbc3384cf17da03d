"""The evidence package's pure modules import no I/O, server, clock or randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rollcap.evidence

PACKAGE = Path(rollcap.evidence.__file__).parent
IO_MODULES = {"_attach.py", "__init__.py"}  # the one I/O entry point, and the re-exports
FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "datetime",
    "fcntl",
    "httpx",
    "io",
    "os",
    "pathlib",
    "random",
    "rollcap.server",
    "rollcap.store",
    "secrets",
    "shutil",
    "socket",
    "starlette",
    "subprocess",
    "tempfile",
    "threading",
    "time",
    "urllib",
    "uuid",
    "uvicorn",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


PURE = sorted(p for p in PACKAGE.glob("*.py") if p.name not in IO_MODULES)


@pytest.mark.parametrize("path", PURE, ids=lambda p: p.name)
def test_pure_modules_import_nothing_that_touches_the_world(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
        or name == "rollcap.evidence._attach"
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_every_module_is_checked_or_named_io() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} == {p.name for p in PURE} | IO_MODULES
    assert len(PURE) >= 9
