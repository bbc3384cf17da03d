"""The renderers' common part: frames encoded as SSE events, as the dialects send them."""

from __future__ import annotations

from rollcap.testing._render import Renderer


def test_frames_are_encoded_one_event_each() -> None:
    frames = Renderer().encode([("message_stop", {"type": "message_stop"}), (None, "[DONE]")])
    assert frames == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        b"data: [DONE]\n\n",
    )
