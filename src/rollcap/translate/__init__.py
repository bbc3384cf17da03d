"""Translation between the client dialects and an upstream that speaks only Chat Completions.

Pure: no I/O and no clocks. Ids and timestamps are passed in, so the same input always gives the
same output.

Requests (raise ``ValueError`` naming the field for a bad client request):
    ``responses_request_to_chat(request)``, ``messages_request_to_chat(request)``
The chat names of a Responses request's namespaced functions (never raises):
    ``namespaced_tool_names(request)`` -> ``{chat_name: (namespace, name)}``
Complete answers (never raise on upstream output):
    ``chat_response_to_responses(chat, request, *, response_id, created_at)``,
    ``chat_response_to_messages(chat, request, *, message_id)``
Streams, chat SSE events in, client SSE events out as they arrive:
    ``ChatToResponsesStream(request, *, response_id, created_at)``,
    ``ChatToMessagesStream(request, *, message_id)``, each with ``feed(event)`` and ``finish()``
Replay of a complete response object as its dialect's stream:
    ``render_sse(dialect, response)``

The rules for the ambiguous points are in the docstrings of ``_responses_request``,
``_responses_answer``, ``_messages``, ``_common`` and ``_render``. The property that ties them
together: a translated stream, reassembled with ``rollcap.dialects.reassemble``, equals the
non-streamed translation of the reassembled chat answer (for answers whose parts arrive in the
order reasoning, text, tool calls), and a rendered response reassembles to itself.
"""

from __future__ import annotations

from rollcap.translate._events import ANTHROPIC_ERROR_TYPES, THINKING_SIGNATURE
from rollcap.translate._messages import (
    ChatToMessagesStream,
    chat_response_to_messages,
    messages_request_to_chat,
)
from rollcap.translate._render import render_sse
from rollcap.translate._requests import VLLM_PASSTHROUGH
from rollcap.translate._responses_answer import ChatToResponsesStream, chat_response_to_responses
from rollcap.translate._responses_request import namespaced_tool_names, responses_request_to_chat

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "THINKING_SIGNATURE",
    "VLLM_PASSTHROUGH",
    "ChatToMessagesStream",
    "ChatToResponsesStream",
    "chat_response_to_messages",
    "chat_response_to_responses",
    "messages_request_to_chat",
    "namespaced_tool_names",
    "render_sse",
    "responses_request_to_chat",
]
