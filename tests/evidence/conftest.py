"""Builders of raw capture records and calls, shared by the evidence tests."""

from __future__ import annotations

from typing import Any

from rollcap.records import ModelCallRecord

POLICY = {"type": "responses_api_models", "name": "policy_model"}
JUDGE = {"type": "responses_api_models", "name": "judge_model"}


def call_id(n: int) -> str:
    return f"{n:032x}"


def responses_raw(
    n: int,
    *,
    session: str | None = None,
    response_id: str | None = None,
    server: dict[str, str] = POLICY,
    output: list[dict[str, Any]] | None = None,
    usage: dict[str, Any] | None = None,
    latency_ms: float | None = 500.25,
    **extra: Any,
) -> dict[str, Any]:
    """One raw Responses capture record, number ``n``, at fixed times."""
    raw: dict[str, Any] = {
        "model_call_id": call_id(n),
        "dialect": "responses",
        "model_ref": server,
        "started_at": 1000.0 + n,
        "completed_at": 1000.5 + n,
        "latency_ms": latency_ms,
        "latency_ttft_ms": None,
        "status_code": 200,
        "error_category": None,
        "request": {"model": "m", "input": [{"role": "user", "content": f"q{n}"}]},
        "response": {
            "id": response_id or f"resp_{n}",
            "status": "completed",
            "model": "m",
            "output": output
            if output is not None
            else [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": f"a{n}", "annotations": []}],
                }
            ],
            "usage": usage
            if usage is not None
            else {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        },
    }
    if session is not None:
        raw["client_session_id"] = session
    raw.update(extra)
    return raw


def calls_of(*raws: dict[str, Any]) -> list[ModelCallRecord]:
    """The raws as a tolerant read gives them: ``call_index`` is the position."""
    return [ModelCallRecord.from_raw(raw, index) for index, raw in enumerate(raws)]


def by_id(n: int) -> dict[str, Any]:
    return {"model_call_id": call_id(n)}


def by_response(n: int, server: dict[str, str] = POLICY) -> dict[str, Any]:
    return {"model_ref": server, "response_id": f"resp_{n}"}


def canonical(n: int, server: dict[str, str] = POLICY) -> dict[str, Any]:
    return {"model_call_id": call_id(n), "model_ref": server, "response_id": f"resp_{n}"}


def invocation(invocation_id: str, *refs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "kind": "agent_invocation",
        "invocation_id": invocation_id,
        "model_calls": list(refs),
        **fields,
    }


def bundle(*records: dict[str, Any], gaps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"source": "test_agent", "records": list(records)}
    if gaps is not None:
        out["gaps"] = gaps
    return out


def gap(code: str, detail: str | None = None, invocation_id: str | None = None) -> dict[str, Any]:
    return {"code": code, "invocation_id": invocation_id, "detail": detail}
