"""Freeze the public names of rollcap.staging, and keep the package a leaf."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollcap.staging

PUBLIC = {
    "CAPTURE_FAILED",
    "CAPTURE_FIELD",
    "COORDS_FIELD",
    "EMPTY_EXTRAS_DIGEST",
    "PREFIX_IDS_FIELD",
    "REASON_CALL_FAILED",
    "REASON_DUPLICATE_CALL",
    "REASON_EXTRACTION_FAILED",
    "REASON_INTERNAL_ERROR",
    "REASON_INVALID_ADMISSION",
    "REASON_INVALID_INPUT",
    "REASON_NOT_IN_FLIGHT",
    "REASON_PARENT_PREFIX_MISMATCH",
    "REASON_REQUIRED_PREFIX_MISMATCH",
    "REASON_SINK_FAILED",
    "REASON_UNKNOWN_PARENT",
    "REQUEST_FIELDS",
    "ROOT_CHAIN_HASH",
    "SCHEMA_VERSION",
    "STAGED",
    "Admission",
    "CaptureAdapter",
    "CommitCoords",
    "DirectoryStagingSink",
    "ExtractionError",
    "InMemoryStagingSink",
    "LinearizeError",
    "LinearizedChain",
    "PendingCall",
    "RolloutTokenCapture",
    "StagedCallRecord",
    "StagedRecordError",
    "StagingError",
    "StagingSink",
    "StagingSource",
    "VLLMCaptureAdapter",
    "linearize",
    "linearize_records",
    "validate_model_call_id",
    "verify_record",
}

PACKAGE_DIR = Path(rollcap.staging.__file__).parent


def test_exported_names_are_frozen() -> None:
    assert set(rollcap.staging.__all__) == PUBLIC
    for name in rollcap.staging.__all__:
        assert hasattr(rollcap.staging, name), name


def test_exported_objects_live_in_rollcap_staging() -> None:
    for name in rollcap.staging.__all__:
        module = getattr(getattr(rollcap.staging, name), "__module__", "rollcap.staging")
        if module in {"builtins", "typing"}:  # constants: str, int, dict
            continue
        assert module.startswith("rollcap.staging"), (name, module)


def test_agreed_constants() -> None:
    assert rollcap.staging.SCHEMA_VERSION == 1
    assert rollcap.staging.STAGED == "staged"
    assert rollcap.staging.CAPTURE_FAILED == "capture_failed"
    assert rollcap.staging.ROOT_CHAIN_HASH == "0" * 64
    assert rollcap.staging.PREFIX_IDS_FIELD == "required_prefix_token_ids"
    assert dict(rollcap.staging.REQUEST_FIELDS) == {
        "return_token_ids": True,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            assert node.module is not None
            names.add(node.module)
    return names


def test_package_imports_only_stdlib_orjson_and_pure_rollcap_modules() -> None:
    allowed_rollcap = {"rollcap.ids", "rollcap.staging"}
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for name in _imported_modules(path):
            top = name.split(".")[0]
            if top == "rollcap":
                assert name in allowed_rollcap or name.startswith("rollcap.staging."), (
                    path.name,
                    name,
                )
            else:
                assert top in sys.stdlib_module_names or top in {"orjson", "__future__"}, (
                    path.name,
                    name,
                )


def test_importing_the_package_loads_no_server_stack() -> None:
    code = (
        "import sys, rollcap.staging\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'aiohttp', 'starlette', 'uvicorn'} or m.startswith('rollcap.server'))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "[]"
