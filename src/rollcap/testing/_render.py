"""What every dialect renderer of the fake upstream is: a final object, a stream, an error.

The renderers (``_render_responses``, ``_render_chat``, ``_render_messages``) are deliberately
independent of ``rollcap.translate``, which also renders responses as their dialect's events:
the fake is the test oracle that the translation, the reassembly and the capture are checked
against, so it must not share their code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from rollcap.sse import SSEEvent, encode_event
from rollcap.testing._plan import Plan

__all__ = ["Frame", "Renderer"]

# One SSE frame before encoding: the event name and its data (an object, or raw text).
Frame = tuple[str | None, dict[str, Any] | str]


class Renderer:
    """A dialect's shapes: the final object, the complete stream, and its mid-stream error."""

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        raise NotImplementedError

    def error_frames(self) -> list[Frame]:
        raise NotImplementedError

    def encode(self, frames: Sequence[Frame]) -> tuple[bytes, ...]:
        return tuple(_encode(name, data) for name, data in frames)


def _encode(name: str | None, data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return encode_event(SSEEvent(data=text, event=name))
