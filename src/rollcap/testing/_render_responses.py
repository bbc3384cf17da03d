"""The fake upstream's OpenAI Responses answers: the response object and its event stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap._json import as_dict, as_str
from rollcap.testing._plan import Finish, Plan, ToolPlan
from rollcap.testing._render import Frame, Renderer

__all__ = ["ResponsesRenderer"]


class ResponsesRenderer(Renderer):
    def _response(
        self,
        plan: Plan,
        body: Mapping[str, Any],
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
    ) -> dict[str, Any]:
        reasoning = as_dict(body.get("reasoning"))
        tools = body.get("tools")
        temperature = body.get("temperature")
        max_output_tokens = body.get("max_output_tokens")
        return {
            "id": f"resp_{plan.ident('response', 48)}",
            "object": "response",
            "created_at": plan.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": as_str(body.get("instructions")),
            "max_output_tokens": max_output_tokens if isinstance(max_output_tokens, int) else None,
            "max_tool_calls": None,
            "model": plan.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": as_str(body.get("previous_response_id")),
            "prompt_cache_key": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": None,
            "service_tier": "default",
            "store": True,
            "temperature": temperature if isinstance(temperature, int | float) else 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": tools if isinstance(tools, list) else [],
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    def _usage(self, plan: Plan) -> dict[str, Any]:
        u = plan.usage
        return {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.total_tokens,
        }

    def _items(self, plan: Plan) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each output item, final, with the events that stream it (``output_index`` set)."""
        items: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        if plan.reasoning is not None:
            items.append(self._reasoning_item(plan, plan.reasoning, len(items)))
        if plan.tool is not None:
            items.append(self._function_call_item(plan, plan.tool, len(items)))
        if plan.text is not None:
            items.append(self._message_item(plan, plan.text, len(items)))
        return items

    def _reasoning_item(
        self, plan: Plan, reasoning: str, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"rs_{plan.ident('reasoning', 48)}"
        final = {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": reasoning}],
        }
        at = {"item_id": item_id, "output_index": index, "summary_index": 0}
        events = [
            _typed(
                "response.output_item.added",
                output_index=index,
                item={"id": item_id, "type": "reasoning", "summary": []},
            ),
            _typed(
                "response.reasoning_summary_part.added",
                **at,
                part={"type": "summary_text", "text": ""},
            ),
            *(
                _typed("response.reasoning_summary_text.delta", **at, delta=piece)
                for piece in plan.reasoning_pieces
            ),
            _typed("response.reasoning_summary_text.done", **at, text=reasoning),
            _typed(
                "response.reasoning_summary_part.done",
                **at,
                part={"type": "summary_text", "text": reasoning},
            ),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def _function_call_item(
        self, plan: Plan, tool: ToolPlan, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"fc_{plan.ident('function_call', 48)}"
        call_id = f"call_{plan.ident('call', 24)}"

        def item(status: str, arguments: str) -> dict[str, Any]:
            return {
                "id": item_id,
                "type": "function_call",
                "status": status,
                "arguments": arguments,
                "call_id": call_id,
                "name": tool.name,
            }

        final = item("completed", tool.arguments)
        at = {"item_id": item_id, "output_index": index}
        events = [
            _typed("response.output_item.added", output_index=index, item=item("in_progress", "")),
            *(
                _typed("response.function_call_arguments.delta", **at, delta=piece)
                for piece in tool.pieces
            ),
            _typed("response.function_call_arguments.done", **at, arguments=tool.arguments),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def _message_item(
        self, plan: Plan, text: str, index: int
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        item_id = f"msg_{plan.ident('message', 48)}"
        status = "incomplete" if plan.finish is Finish.LENGTH else "completed"

        def part(value: str) -> dict[str, Any]:
            return {"type": "output_text", "annotations": [], "logprobs": [], "text": value}

        final = {
            "id": item_id,
            "type": "message",
            "status": status,
            "content": [part(text)],
            "role": "assistant",
        }
        at = {"item_id": item_id, "output_index": index, "content_index": 0}
        events = [
            _typed(
                "response.output_item.added",
                output_index=index,
                item={
                    "id": item_id,
                    "type": "message",
                    "status": "in_progress",
                    "content": [],
                    "role": "assistant",
                },
            ),
            _typed("response.content_part.added", **at, part=part("")),
            *(
                _typed("response.output_text.delta", **at, delta=piece, logprobs=[])
                for piece in plan.text_pieces
            ),
            _typed("response.output_text.done", **at, text=text, logprobs=[]),
            _typed("response.content_part.done", **at, part=part(text)),
            _typed("response.output_item.done", output_index=index, item=final),
        ]
        return final, events

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        status = "incomplete" if plan.finish is Finish.LENGTH else "completed"
        output = [final for final, _ in self._items(plan)]
        return self._response(plan, body, status, output, self._usage(plan))

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        started = self._response(plan, body, "in_progress", [], None)
        payloads = [
            _typed("response.created", response=started),
            _typed("response.in_progress", response=started),
        ]
        for _, events in self._items(plan):
            payloads.extend(events)
        final = self.final(plan, body)
        terminal = (
            "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        )
        payloads.append(_typed(terminal, response=final))
        return [(payload["type"], payload) for payload in payloads]

    def error_frames(self) -> list[Frame]:
        return [
            (
                "error",
                _typed(
                    "error",
                    code="server_error",
                    message="The server had an error while processing your request.",
                    param=None,
                ),
            )
        ]

    def encode(self, frames: Sequence[Frame]) -> tuple[bytes, ...]:
        # Sequence numbers count the frames actually sent, in order; a raw (non-JSON) frame
        # carries none.
        numbered: list[Frame] = []
        number = 0
        for name, data in frames:
            if isinstance(data, dict):
                data = {**data, "sequence_number": number}
                number += 1
            numbered.append((name, data))
        return super().encode(numbered)


def _typed(kind: str, **fields: Any) -> dict[str, Any]:
    # ``sequence_number`` right after ``type``, as the API orders them; set when encoding.
    return {"type": kind, "sequence_number": 0, **fields}
