"""What the server needs to answer Responses and Messages calls from a chat-only upstream.

Pure glue over ``rollcap.translate``: pick the request translator, a stream translator with the
ids it is handed, and turn an upstream's chat answer or error into the client's dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson

from rollcap._json import load_json_object
from rollcap.dialects import error_message, messages
from rollcap.sse import SSEEvent
from rollcap.translate import (
    ANTHROPIC_ERROR_TYPES,
    ChatToMessagesStream,
    ChatToResponsesStream,
    chat_response_to_messages,
    chat_response_to_responses,
    messages_request_to_chat,
    responses_request_to_chat,
)

__all__ = ["CHAT_PATH", "TO_CHAT", "StreamTranslator", "Translation", "error_for_client"]

# Where a translated call goes upstream.
CHAT_PATH = "/v1/chat/completions"

TO_CHAT: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "responses": responses_request_to_chat,
    "messages": messages_request_to_chat,
}


class StreamTranslator(Protocol):
    def feed(self, event: SSEEvent) -> list[SSEEvent]: ...

    def finish(self) -> list[SSEEvent]: ...


class Translation:
    """One call's translation: the request to send, and how to turn the answer back."""

    def __init__(
        self, dialect: str, request: Mapping[str, Any], *, answer_id: str, created: float
    ) -> None:
        """``answer_id`` (hex) and ``created`` (a wall time) make the ids and the timestamp the
        client sees; the upstream's own ids stay in the upstream's answer."""
        self.dialect = dialect
        self.request = request
        self.chat_request = TO_CHAT[dialect](request)
        self._id = answer_id
        self._created = created

    def answer(self, chat: Mapping[str, Any], *, served_id: str | None = None) -> dict[str, Any]:
        """The client's answer from upstream's chat completion; ``served_id``, when given, is
        the id it carries instead of one made from ``answer_id`` (staging keeps the worker's)."""
        if self.dialect == "responses":
            response_id = f"resp_{self._id}" if served_id is None else served_id
            return chat_response_to_responses(
                chat, self.request, response_id=response_id, created_at=self._created
            )
        message_id = f"msg_{self._id}" if served_id is None else served_id
        return chat_response_to_messages(chat, self.request, message_id=message_id)

    def stream(self) -> StreamTranslator:
        if self.dialect == "responses":
            return ChatToResponsesStream(
                self.request, response_id=f"resp_{self._id}", created_at=self._created
            )
        return ChatToMessagesStream(self.request, message_id=f"msg_{self._id}")


def error_for_client(dialect: str, status: int, body: bytes) -> bytes:
    """An upstream (OpenAI-shaped) error body, as the client's dialect shapes errors."""
    if dialect != "messages":
        return body  # Responses errors have the chat API's shape already
    parsed = load_json_object(body)
    message = error_message(parsed) if parsed is not None else None
    if message is None:
        message = body.decode("utf-8", errors="replace")
    kind = ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return orjson.dumps(messages.error_body(kind, message))
