from __future__ import annotations

from rollcap.dialects._base import openai_error


def test_openai_error_has_the_shape_the_openai_sdks_parse() -> None:
    assert openai_error("no", param="p") == {
        "error": {"message": "no", "type": "invalid_request_error", "param": "p", "code": None}
    }
    assert openai_error("down", kind="server_error", code="server_error")["error"] == {
        "message": "down",
        "type": "server_error",
        "param": None,
        "code": "server_error",
    }
