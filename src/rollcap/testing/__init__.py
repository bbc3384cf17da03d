"""A fake upstream model API for tests, benchmarks and trying rollcap without a real model.

``FakeUpstream`` is a real HTTP server on 127.0.0.1 that speaks the three dialects as the official
SDKs expect them: ``POST /v1/responses`` (OpenAI Responses, also over a WebSocket: see below),
``POST /v1/chat/completions`` (OpenAI Chat Completions), ``POST /v1/messages`` (Anthropic
Messages), plus ``GET /v1/models`` and ``GET /health`` (``in_flight`` requests and
``open_connections``, its own included). Each answers non-streamed or, with ``"stream": true``,
as the API's SSE stream. A Messages request that asks for ``context_management`` (Claude Code's
beta) gets ``context_management`` back, on the message and, streamed, beside ``delta`` and
``usage`` in ``message_delta``, as the API sends it.

    async with FakeUpstream() as upstream:          # or FakeUpstream.running_in_thread()
        client = openai.AsyncOpenAI(base_url=upstream.url + "/v1", api_key="x")

The answer is chosen by the ``x-fake-scenario`` header, else by the request's ``model`` when it is
a scenario name, else ``text``:

- ``text``: a short sentence. ``x-fake-events: N``: N text deltas (N words) when streamed;
  ``x-fake-content-bytes: N``: about N bytes of text.
- ``choice``, ``choice-<seed>`` (seed 0 to 2**31; ``choice`` is 0): deterministic
  multiple-choice answers that differ by seed, so that two evaluation runs of a benchmark differ.
  The answer is one option letter (``B``), chosen by sha256 of the seed and the text of the last
  user message (with text) from the letters that its lines ``A) ...``, ``B) ...`` list; the same
  seed answers a prompt alike every time. A prompt that lists no option gets the ``text`` answer.
- ``tool``: a call to the request's first tool (else ``lookup``), arguments sampled from its
  schema, split over several deltas when streamed.
- ``tool_turns``: a multi-turn tool conversation. While the request sends back fewer tool results
  than ``x-fake-tool-turns`` (default 2), a call to its next tool (the request's tools in turn,
  arguments sampled from the tool's schema, as ``tool``); then the text answer. An agent that
  runs the tools and sends their results back thus gets N tool calls, then its answer.
- ``reasoning``: reasoning (Responses summary, chat ``reasoning_content``, Anthropic ``thinking``
  with a signature), then text.
- ``incomplete``: text cut by the output limit (``response.incomplete`` / ``length`` /
  ``max_tokens``).
- ``http_400``, ``http_401``, ``http_404``, ``http_429``, ``http_500``, ``http_503`` (any
  ``http_<4xx|5xx>``): that status with the dialect's error body.
- ``context_length``: 400, the prompt exceeds the model's context: OpenAI's error with code
  ``context_length_exceeded`` (Responses and chat), Anthropic's ``prompt is too long``.
- ``malformed_json``: a 200 body that is not JSON; streamed, one data line that is not JSON in the
  middle of an otherwise complete stream.
- ``truncate``: a stream cut half-way without its terminal event, or a body cut short of its
  ``content-length``, then the connection closes.
- ``stream_error``: the dialect's own mid-stream error event (non-streamed: 500, Anthropic 529).
- ``hang``: no answer until the client leaves or the server stops. ``disconnect``: the connection
  closes without an answer.
- ``endless``: a stream that never ends: its text delta (``x-fake-content-bytes`` of text, else a
  short sentence) again and again, in writes of at least 16 KiB, as fast as the client reads
  (or at ``x-fake-chunk-delay-ms``), until the client leaves or the server stops. Streamed only
  (non-streamed: 400).

Any scenario also takes ``x-fake-delay-ms`` (before the first byte), ``x-fake-chunk-delay-ms``
(between stream events) and ``x-fake-cached-tokens`` (default: half the input tokens).

WebSocket mode, as the Responses API has it: ``GET /v1/responses`` upgraded to a WebSocket, with
the same ``authorization`` as over HTTP (else a 401 answer before the upgrade); the handshake's
``x-fake-*`` headers apply to every turn. Each client text message ``{"type": "response.create",
...}`` (a create body without ``stream`` and ``background``) is answered with the events that
``POST /v1/responses`` with ``"stream": true`` streams for the full request, one JSON object per
text message; turns are answered one after another, in the order they came. A turn with
``previous_response_id`` sends only its new input: the socket keeps its last 64 completed (or
incomplete) responses, and the turn is answered as the whole conversation (their input and
output, then the new input; ``instructions`` and ``tools`` are the turn's own). With
``"generate": false`` a turn stores its input without generating (``response.created``, then
``response.completed`` with an empty ``output`` and usage zeros), for a later turn to continue.
A ``response.steer`` is taken and not answered (the fake steers nothing). An unknown
``previous_response_id`` (code ``previous_response_not_found``) or any other message that is
no ``response.create`` is answered with an error event, ``{"type": "error", "status": 400,
"error": {"type": "invalid_request_error", "code": ..., "message": ..., "param": ...}}``, an error
scenario (``http_<status>``, ``context_length``) with one of its status and the ``error`` of its
HTTP body; the socket stays open. ``truncate`` (the events so far) and ``disconnect`` (no
event) close the socket with code 1011, ``hang`` sends nothing more on it, ``endless`` is refused
with an error event, and ``stop()`` closes every socket with code 1001. ``requests`` lists each
message the socket received, with method ``WEBSOCKET``.

The same request gets the same ids and timestamps, streamed or not, and the non-streamed answer
is exactly what ``rollcap.dialects.reassemble`` rebuilds from the stream (chat: with
``stream_options.include_usage``). ``expected_response`` gives it without a server.

Token ids, as vLLM returns them: a chat request with ``"return_token_ids": true`` also gets the
top-level ``prompt_token_ids`` and ``choices[0].token_ids`` (the generated ids), and with
``"logprobs": true`` one ``choices[0].logprobs.content`` entry per generated id (``token`` is
``"token_id:N"`` with ``"return_tokens_as_token_ids": true``, else the id's text; ``top_logprobs``
is always empty). Streamed, each chunk's choice carries its share of ``token_ids`` (and of the
logprobs) and the first chunk the ``prompt_token_ids``. Usage then counts ids. The ids come from a
byte-level fake tokenizer (1 starts a message, 2 ends one, byte ``b`` is ``b + 3``):
``render_prompt(messages)`` gives the prompt ids, the generated ids are ``encode(body) + [2]`` for
the answer's ``assistant_body``, ``decode`` turns ids back into text (leaving out the special ids)
and ``fake_logprob(id, position)`` is each generated id's logprob. Sending an answer back as the
next assistant message makes the next prompt start with this prompt plus the generated ids. The
request field ``PREFIX_IDS_FIELD`` pins the prompt's start: its ids, then the messages after the
last assistant message. Without ``return_token_ids`` nothing of this appears.
"""

from rollcap.testing._knobs import (
    DEFAULT_MODEL,
    HEADER_CACHED_TOKENS,
    HEADER_CHUNK_DELAY_MS,
    HEADER_CONTENT_BYTES,
    HEADER_DELAY_MS,
    HEADER_EVENTS,
    HEADER_SCENARIO,
    HEADER_TOOL_TURNS,
    SCENARIOS,
)
from rollcap.testing._scenarios import expected_response
from rollcap.testing._server import FakeUpstream, ReceivedRequest
from rollcap.testing._tokens import (
    PREFIX_IDS_FIELD,
    assistant_body,
    decode,
    encode,
    fake_logprob,
    render_prompt,
)

__all__ = [
    "DEFAULT_MODEL",
    "HEADER_CACHED_TOKENS",
    "HEADER_CHUNK_DELAY_MS",
    "HEADER_CONTENT_BYTES",
    "HEADER_DELAY_MS",
    "HEADER_EVENTS",
    "HEADER_SCENARIO",
    "HEADER_TOOL_TURNS",
    "PREFIX_IDS_FIELD",
    "SCENARIOS",
    "FakeUpstream",
    "ReceivedRequest",
    "assistant_body",
    "decode",
    "encode",
    "expected_response",
    "fake_logprob",
    "render_prompt",
]
