"""The fake upstream's Chat Completions answers: the completion and its chunk stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollcap.dialects.chat import wants_stream_usage
from rollcap.testing import _tokens as tokenizer
from rollcap.testing._plan import Finish, Plan
from rollcap.testing._render import Frame, Renderer

__all__ = ["ChatRenderer"]


_CHAT_FINISH = {Finish.STOP: "stop", Finish.TOOL: "tool_calls", Finish.LENGTH: "length"}


class ChatRenderer(Renderer):
    def _top(self, plan: Plan) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{plan.ident('chat', 32)}",
            "created": plan.created,
            "model": plan.model,
        }

    def _extras(self, plan: Plan) -> dict[str, Any]:
        return {"service_tier": "default", "system_fingerprint": f"fp_{plan.ident('fp', 10)}"}

    def _usage(self, plan: Plan) -> dict[str, Any]:
        u = plan.usage
        return {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": u.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _call_id(self, plan: Plan) -> str:
        return f"call_{plan.ident('call', 24)}"

    def _logprobs(
        self, body: Mapping[str, Any], ids: Sequence[int], start: int
    ) -> dict[str, Any] | None:
        """The ``logprobs`` of a choice carrying generated ``ids`` from position ``start``."""
        if body.get("logprobs") is not True or not ids:
            return None
        as_token_ids = body.get("return_tokens_as_token_ids") is True
        return {"content": tokenizer.logprob_entries(ids, start=start, as_token_ids=as_token_ids)}

    def final(self, plan: Plan, body: Mapping[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": plan.text, "refusal": None}
        if plan.reasoning is not None:
            message["reasoning_content"] = plan.reasoning
        if plan.tool is not None:
            message["tool_calls"] = [
                {
                    "id": self._call_id(plan),
                    "type": "function",
                    "function": {"name": plan.tool.name, "arguments": plan.tool.arguments},
                }
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _CHAT_FINISH[plan.finish],
        }
        tokens: dict[str, Any] = {}
        if plan.tokens is not None:
            choice["logprobs"] = self._logprobs(body, plan.tokens.generated, 0)
            choice["token_ids"] = list(plan.tokens.generated)
            tokens["prompt_token_ids"] = list(plan.tokens.prompt)
        return {
            **self._top(plan),
            "object": "chat.completion",
            "choices": [choice],
            "usage": self._usage(plan),
            **self._extras(plan),
            **tokens,
        }

    def _chunk_ids(self, plan: Plan) -> list[list[int]]:
        """The generated ids each chunk of the stream carries, in the order of ``frames``."""
        ids: list[list[int]] = [[]]  # the first chunk: the role (and the tool call's name)
        ids.extend([] for _ in plan.reasoning_pieces)
        ids.extend(tokenizer.encode(piece) for piece in plan.text_pieces)
        finish = [tokenizer.END_ID]
        if plan.tool is not None and plan.tool.pieces:
            # The call's text around its arguments goes with the first and last argument pieces.
            head, tail = tokenizer.tool_call_parts(plan.tool.name)
            pieces = [tokenizer.encode(piece) for piece in plan.tool.pieces]
            pieces[0][:0] = tokenizer.encode(head)
            pieces[-1].extend(tokenizer.encode(tail))
            ids.extend(pieces)
        elif plan.tool is not None:  # no argument deltas: the whole call goes with the finish
            finish[:0] = tokenizer.encode(
                tokenizer.tool_call_text(plan.tool.name, plan.tool.arguments)
            )
        ids.append(finish)
        return ids

    def frames(self, plan: Plan, body: Mapping[str, Any]) -> list[Frame]:
        include_usage = wants_stream_usage(body)
        top = {**self._top(plan), "object": "chat.completion.chunk", **self._extras(plan)}
        # With token ids: each chunk's share of the generated ids, the prompt on the first chunk.
        chunk_ids = iter(self._chunk_ids(plan)) if plan.tokens is not None else None
        position, opening = 0, True

        def chunk(delta: dict[str, Any], finish: str | None = None) -> Frame:
            nonlocal position, opening
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
            data: dict[str, Any] = {**top, "choices": [choice]}
            if include_usage:
                data["usage"] = None
            if plan.tokens is not None and chunk_ids is not None:
                ids = next(chunk_ids)
                choice["logprobs"] = self._logprobs(body, ids, position)
                choice["token_ids"] = ids
                if opening:
                    data["prompt_token_ids"] = list(plan.tokens.prompt)
                position += len(ids)
            opening = False
            return (None, data)

        first: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        if plan.tool is not None:
            first["content"] = None
            first["tool_calls"] = [
                {
                    "index": 0,
                    "id": self._call_id(plan),
                    "type": "function",
                    "function": {"name": plan.tool.name, "arguments": ""},
                }
            ]
        frames = [chunk(first)]
        frames.extend(chunk({"reasoning_content": piece}) for piece in plan.reasoning_pieces)
        frames.extend(chunk({"content": piece}) for piece in plan.text_pieces)
        if plan.tool is not None:
            frames.extend(
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                for piece in plan.tool.pieces
            )
        frames.append(chunk({}, _CHAT_FINISH[plan.finish]))
        if include_usage:
            frames.append((None, {**top, "choices": [], "usage": self._usage(plan)}))
        frames.append((None, "[DONE]"))
        return frames

    def error_frames(self) -> list[Frame]:
        error = {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": "server_error",
        }
        return [(None, {"error": error}), (None, "[DONE]")]
