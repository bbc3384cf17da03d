"""The capturing model server."""

from rollcap.server._app import ModelServerSettings, create_model_app
from rollcap.server._middleware import CaptureState
from rollcap.server._upstream import MODEL_TYPES

__all__ = ["MODEL_TYPES", "CaptureState", "ModelServerSettings", "create_model_app"]
