"""The fake upstream's Anthropic Messages answers: the message and its event stream."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson

from rollcap.testing._plan import Finish, Plan
from rollcap.testing._render import Frame, Renderer

__all__ = ["MessagesRenderer"]


_MESSAGES_STOP = {Finish.STOP: "end_turn", Finish.TOOL: "tool_use", Finish.LENGTH: "max_tokens"}


def _context_management(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the API answers a request that asks for context management (the beta Claude Code
    sends on every call): the edits it applied, none here."""
    if isinstance(body.get("context_management"), Mapping):
        return {"context_management": {"applied_edits": []}}
    return {}


class MessagesRenderer(Renderer):
    def _usage(self, plan: Plan, output_tokens: int) -> dict[str, Any]:
        u = plan.usage
        return {
            "input_tokens": u.input_tokens - u.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def _message(
        self, plan: Plan, content: list[dict[str, Any]], stop_reason: str | None, output: int
    ) -> dict[str, Any]:
        return {
            "id": f"msg_01{plan.ident('message', 22)}",
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": self._usage(plan, output),
        }

    def _signature(self, plan: Plan) -> str:
        raw = bytes.fromhex(plan.ident("signature", 96))
        return base64.b64encode(raw).decode()

    def _blocks(self, plan: Plan) -> list[tuple[dict[str, Any], dict[str, Any], list[Any]]]:
        """Each content block: final, as started, and its deltas."""
        blocks: list[tuple[dict[str, Any], dict[str, Any], list[Any]]] = []
        if plan.reasoning is not None:
            signature = self._signature(plan)
            blocks.append(
                (
                    {"type": "thinking", "thinking": plan.reasoning, "signature": signature},
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [
                        *({"type": "thinking_delta", "thinking": p} for p in plan.reasoning_pieces),
                        {"type": "signature_delta", "signature": signature},
                    ],
                )
            )
        if plan.text is not None:
            blocks.append(
                (
                    {"type": "text", "text": plan.text},
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": p} for p in plan.text_pieces],
                )
            )
        if plan.tool is not None:
            tool_id = f"toolu_01{plan.ident('tool_use', 22)}"
            tool = {"type": "tool_use", "id": tool_id, "name": plan.tool.name}
            blocks.append(
                (
                    {**tool, "input": orjson.loads(plan.tool.arguments)},
                    {**tool, "input": {}},
                    [
                        {"type": "input_json_delta", "partial_json": p}
                        for p in ("", *plan.tool.pieces)
                    ],
                )
            )
        return blocks

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        content = [final for final, _, _ in self._blocks(plan)]
        message = self._message(
            plan, content, _MESSAGES_STOP[plan.finish], plan.usage.output_tokens
        )
        return {**message, **_context_management(body)}

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        def event(kind: str, **fields: Any) -> Frame:
            return (kind, {"type": kind, **fields})

        frames = [event("message_start", message=self._message(plan, [], None, 1))]
        for index, (_, start, deltas) in enumerate(self._blocks(plan)):
            frames.append(event("content_block_start", index=index, content_block=start))
            if index == 0:
                frames.append(event("ping"))
            frames.extend(event("content_block_delta", index=index, delta=d) for d in deltas)
            frames.append(event("content_block_stop", index=index))
        usage = self._usage(plan, plan.usage.output_tokens)
        del usage["service_tier"]
        frames.append(
            event(
                "message_delta",
                delta={"stop_reason": _MESSAGES_STOP[plan.finish], "stop_sequence": None},
                usage=usage,
                # Beside delta and usage, where the API reports it (and Claude Code reads it).
                **_context_management(body),
            )
        )
        frames.append(event("message_stop"))
        return frames

    def error_frames(self) -> list[Frame]:
        error = {"type": "overloaded_error", "message": "Overloaded"}
        return [("error", {"type": "error", "error": error})]
