"""The structure docs/architecture.md describes, kept honest: read from the source, not assumed.

- The pure core imports no I/O, no server, no clock and no randomness (an allow-list of what it
  may import, checked on every import statement of every pure module).
- The import graph has no cycle, and no module imports a layer above its own.
- A user's resources server, and ``import rollcap`` itself, load no server stack.
- Every module has its test module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import rollcap

SRC = Path(rollcap.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent

# -- the modules and their imports ------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SRC.rglob("*.py"))}


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """``(imported module, line)`` for every import statement, wherever it is in the module.

    ``from package import name`` imports ``package.name`` when that is a module, else
    ``package``. Imports under ``if TYPE_CHECKING:`` count too: they are dependencies all the
    same.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            assert node.module is not None
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield (submodule if submodule in _modules() else node.module), node.lineno
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            raise AssertionError(f"{path}:{node.lineno}: __import__ hides an import")


def _rollcap_imports(module: str) -> set[str]:
    return {name for name, _ in _imports(_modules()[module]) if name.split(".")[0] == "rollcap"}


# -- the pure core ----------------------------------------------------------------------------

# Values in, values out: bytes, dicts and dataclasses, no sockets, files, threads, clocks or
# randomness. Everything else in rollcap is a shell around these.
PURE = {
    "rollcap._json",
    "rollcap.affinity",
    "rollcap.attachment",  # reads through the store it is handed, imports none
    "rollcap.compare._compare",
    "rollcap.compare._lines",
    "rollcap.compare._model",
    "rollcap.compare._stats",  # scipy and statsmodels compute; they read and write nothing
    "rollcap.compare._text",
    "rollcap.conversation",
    "rollcap.ids",
    "rollcap.metrics",
    "rollcap.records",
    "rollcap.routing",
    "rollcap.sse",
    *(name for name in _modules() if name.startswith(("rollcap.dialects", "rollcap.translate"))),
    *(
        f"rollcap.evidence.{name}"
        for name in (
            "_capture",
            "_codes",
            "_compaction",
            "_export",
            "_items",
            "_join",
            "_models",
            "_perf",
            "_trajectory",
        )
    ),
    "rollcap.local._protocol",
    "rollcap.report._budget",
    "rollcap.report._delta",
    "rollcap.report._diverge",
    "rollcap.report._embed",
    "rollcap.report._facts",
    "rollcap.report._model",
    "rollcap.report._otel_content",
    "rollcap.report._otel_map",
    "rollcap.server._inflight",
    "rollcap.server._recorder",
    "rollcap.server._socket_events",
    "rollcap.server._socket_state",
    "rollcap.server._translating",
    "rollcap.status._board",
    "rollcap.status._rules",
    "rollcap.staging._adapters",
    "rollcap.staging._digest",
    "rollcap.staging._fingerprint",
    "rollcap.staging._rebuild",
    "rollcap.staging._records",
    "rollcap.staging._routes",
    "rollcap.staging._terminal",
    "rollcap.store._frames",
    "rollcap.store._mounts",
    "rollcap.testing._knobs",
    "rollcap.testing._plan",
    "rollcap.testing._render",
    "rollcap.testing._render_chat",
    "rollcap.testing._render_messages",
    "rollcap.testing._render_responses",
    "rollcap.testing._scenarios",
    "rollcap.testing._socket",
    "rollcap.testing._tokens",
}
# What a pure module may import besides other pure modules: the standard library's data
# modules, and orjson. An allow-list, so a new import is a decision: os, io, pathlib, socket,
# asyncio, threading, time, datetime, random, uuid, secrets, logging, aiohttp, starlette,
# uvicorn and anyio are all outside it. sys is in for sys.byteorder (staging's digests).
PURE_MAY_IMPORT = frozenset(
    {
        "__future__",
        "abc",
        "array",
        "base64",
        "binascii",
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "decimal",
        "enum",
        "functools",
        "hashlib",
        "hmac",
        "itertools",
        "json",
        "math",
        "numpy",
        "operator",
        "orjson",
        "pydantic",  # the evidence models: validation is computation on values
        "re",
        "scipy",
        "statistics",
        "statsmodels",
        "string",
        "struct",
        "sys",
        "types",
        "typing",
        "typing_extensions",
        "unicodedata",
        "zlib",
        "zstandard",  # compressed capture files: compression is computation on values
    }
)


def test_the_pure_modules_exist() -> None:
    assert set(_modules()) >= PURE, sorted(PURE - set(_modules()))


@pytest.mark.parametrize("module", sorted(PURE))
def test_a_pure_module_imports_nothing_impure(module: str) -> None:
    path = _modules()[module]
    bad = []
    for name, line in _imports(path):
        top = name.split(".")[0]
        if top == "rollcap":
            if name not in PURE:
                bad.append(f"line {line}: {name} (not pure)")
        elif top not in PURE_MAY_IMPORT:
            bad.append(f"line {line}: {name}")
    assert bad == [], f"{module} imports {bad}"


def test_the_purity_check_can_fail(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("import time\nfrom rollcap.store import CaptureStore\n")
    found = [name for name, _ in _imports(source)]
    assert found == ["time", "rollcap.store"]
    assert "time" not in PURE_MAY_IMPORT
    assert "rollcap.store" not in PURE


# -- layers and cycles ------------------------------------------------------------------------

# Lowest first. A module may import its own layer and the layers below, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("pure core", tuple(sorted(PURE))),
    ("durable I/O and configuration", ("rollcap.store", "rollcap.config")),
    (
        "shared shells",
        (
            "rollcap._proxy",
            "rollcap._runtime",
            "rollcap.evidence",
            "rollcap.staging",
            "rollcap.status",
            "rollcap.workflow._discovery",
        ),
    ),
    (
        "servers, collection, the fake upstream",
        (
            "rollcap.server",
            "rollcap.worker",
            "rollcap.local",
            "rollcap.gym",
            "rollcap.collect",
            "rollcap.testing",
            "rollcap.report",
        ),
    ),
    ("the evaluation workflow", ("rollcap.workflow", "rollcap.cluster", "rollcap.compare")),
    ("entry points and the public API", ("rollcap.cli", "rollcap.demo", "rollcap")),
]


def _layer(module: str) -> int:
    """The layer of the longest prefix that names ``module`` (``rollcap`` alone: itself only,
    so that a new top-level module must be given a layer)."""
    if module in PURE:
        return 0
    best = (-1, -1)  # (length of the matching prefix, layer)
    for index, (_, prefixes) in enumerate(LAYERS[1:], start=1):
        for prefix in prefixes:
            below = prefix != "rollcap" and module.startswith(prefix + ".")
            if module == prefix or below:
                best = max(best, (len(prefix), index))
    assert best[1] >= 0, f"{module} is in no layer: give it one in LAYERS"
    return best[1]


def test_every_module_has_a_layer_and_the_check_can_fail() -> None:
    assert {_layer(module) for module in _modules()} == set(range(len(LAYERS)))
    edges = [(m, n) for m in _modules() for n in _rollcap_imports(m)]
    assert len(edges) > 200  # the graph really is read
    assert _layer("rollcap.server._app") > _layer("rollcap.store._files") > 0


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {name} ({LAYERS[_layer(name)][0]})"
        for module in _modules()
        for name in _rollcap_imports(module)
        if _layer(name) > _layer(module)
    ]
    assert upward == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> the modules it imports), or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for name in sorted(graph.get(module, ())):
            found = visit(name, [*path, module])
            if found is not None:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found is not None:
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycle({m: _rollcap_imports(m) - {m} for m in _modules()}) is None


def test_the_cycle_check_can_fail() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# -- what importing loads ---------------------------------------------------------------------

# What runs servers, as opposed to what a resources server or an agent is written with (Starlette
# and aiohttp are the gym's own): the model server, the worker and the embedded model, token
# staging and translation, collection, the environment and eval commands, the fake upstream, the
# runtime helpers and the ASGI server itself.
SERVER_STACK = (
    "rollcap.server",
    "rollcap.worker",
    "rollcap.local",
    "rollcap.staging",
    "rollcap.translate",
    "rollcap.collect",
    "rollcap.workflow._env",
    "rollcap.workflow._run",
    "rollcap.workflow._submit",
    "rollcap.testing",
    "rollcap._runtime",
    "uvicorn",
    "uvloop",
    "httptools",
)


def _loaded_by(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    code = (
        f"import sys\n{statement}\n"
        f"prefixes = {prefixes!r}\n"
        "print(sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.')"
        " for p in prefixes)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = eval(out.stdout)  # a list literal printed by the child
    return loaded


def test_a_resources_server_entrypoint_loads_no_server_stack() -> None:
    assert _loaded_by("from rollcap.gym import ResourcesServer", SERVER_STACK) == []


def test_the_check_of_what_is_loaded_can_fail() -> None:
    assert _loaded_by("import rollcap.server", SERVER_STACK)


def test_the_cli_and_the_model_server_load_no_collection_and_no_evidence_models() -> None:
    # Every command imports the CLI, and `rollcap serve model` the server too: what they load at
    # start-up, every model-server process carries for its whole life.
    heavy = ("pydantic", "rollcap.collect", "rollcap.evidence")
    assert _loaded_by("import rollcap.cli, rollcap.server", heavy) == []


def test_import_rollcap_loads_no_server_stack_and_no_web_framework() -> None:
    frameworks = ("aiohttp", "starlette", "anyio")
    assert _loaded_by("import rollcap", SERVER_STACK + frameworks) == []


# -- tests mirror modules ---------------------------------------------------------------------

# Modules whose tests are not named after them, and why. Everything else has
# tests/<package>/test_<module>.py, leading underscores dropped.
MIRROR_EXCEPTIONS = {
    "rollcap.evidence._codes": "names only: each gap code is produced by the test of the module "
    "that emits it",
    "rollcap.server._middleware": "the capture path is tested whole, over sockets: test_app.py",
    **dict.fromkeys(
        ("rollcap.report._otel_cli", "rollcap.report._otel_sdk"),
        "the command and the SDK shell are tested together against a real OTLP receiver: "
        "test_otel_export.py",
    ),
    **dict.fromkeys(
        (
            "rollcap.translate._common",
            "rollcap.translate._events",
            "rollcap.translate._messages",
            "rollcap.translate._responses_answer",
            "rollcap.translate._responses_request",
        ),
        "translation is tested by direction across both dialects, as its rules are stated: "
        "test_requests.py, test_answers.py, test_streams.py",
    ),
}


def _test_path(module: str) -> Path:
    parts = [part.removeprefix("_") for part in module.split(".")[1:]]
    return TESTS.joinpath(*parts[:-1], f"test_{parts[-1]}.py")


def test_every_module_has_its_test_module() -> None:
    modules = [
        name
        for name, path in _modules().items()
        if path.name not in ("__init__.py", "__main__.py") and name not in MIRROR_EXCEPTIONS
    ]
    missing = [f"{name}: {_test_path(name).relative_to(TESTS.parent)}" for name in modules]
    missing = [
        entry
        for name, entry in zip(modules, missing, strict=True)
        if not _test_path(name).is_file()
    ]
    assert missing == []


def test_every_exception_is_still_needed() -> None:
    assert set(MIRROR_EXCEPTIONS) <= set(_modules())
    assert not [name for name in MIRROR_EXCEPTIONS if _test_path(name).is_file()]
