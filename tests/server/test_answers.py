"""The model server's own answers: errors in the client's dialect, upstream failures noted."""

from __future__ import annotations

import orjson
import pytest

from rollcap._proxy.forward import UpstreamFailure
from rollcap.records import ErrorCategory
from rollcap.server._answers import error_body, failure_answer
from rollcap.server._recorder import CallRecorder, Clock


def test_error_bodies_take_the_clients_dialect() -> None:
    assert orjson.loads(error_body("messages", "overloaded_error", "busy")) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
    }
    openai = {"message": "busy", "type": "api_error", "param": None, "code": None}
    assert orjson.loads(error_body("responses", "api_error", "busy")) == {"error": openai}
    assert orjson.loads(error_body(None, "api_error", "busy")) == {"error": openai}


TIMEOUT = UpstreamFailure(504, "timeout", ErrorCategory.TIMEOUT, "did not answer in time")
UNREACHABLE = UpstreamFailure(
    502, "api_connection_error", ErrorCategory.CONNECTION, "unreachable", "refused"
)


@pytest.mark.parametrize(
    ("failure", "category"), [(TIMEOUT, "timeout"), (UNREACHABLE, "connection")]
)
def test_an_upstream_failure_is_answered_and_recorded(
    failure: UpstreamFailure, category: str
) -> None:
    recorder = CallRecorder(
        model_call_id="c" * 32, dialect="chat", server_name="m", start=Clock(0.0, 0.0)
    )
    response = failure_answer(failure, "chat", recorder)
    assert response.status_code == failure.status
    error = orjson.loads(response.body)["error"]
    assert (error["type"], error["message"]) == (failure.kind, str(failure))
    recorder.response_start(response.status_code, {"content-type": "application/json"})
    recorder.finish(Clock(1.0, 1.0))
    assert recorder.record()["error_category"] == category
