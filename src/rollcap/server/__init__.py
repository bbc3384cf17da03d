"""The capturing model server.

One captured call's way through it (``POST /ng-rollout/<id>/v1/chat/completions``, streamed):

1. ``_middleware.CaptureMiddleware._route`` strips the prefix into a child scope
   (``routing.strip_prefix``) and picks the dialect from the path. No prefix: forwarded
   uncaptured (and counted in ``/health``).
2. A ``_middleware._CapturedCall`` wraps the client's ``receive`` and ``send`` around a
   ``_recorder.CallRecorder`` (pure: bytes and clock readings in, one record out), which the
   app finds in the scope (``RECORDER_KEY``), with the request body, read once by the
   middleware (``BODY_KEY``; past ``max_request_bytes``, answered 413).
3. ``_app._Forwarder.forward`` sends the request upstream over one aiohttp session
   (``_proxy.forward.open_upstream``), translated to chat for a chat-only upstream
   (``_translating`` over ``rollcap.translate``) or staged for its token ids (``_staged``).
4. ``_proxy.forward.pass_through`` relays the answer chunk by chunk. Each chunk goes to the
   client first, then feeds ``CallRecorder.body``: the raw bytes kept once, up to
   ``capture_max_response_bytes``, the SSE decoder, the terminal event, and the stream's
   reassembly (``dialects.<name>.StreamReassembler``), as the chunks pass.
5. The chunk that completes the terminal event (a non-streamed answer: all of it) is held.
   ``CallRecorder.finish`` ends the call and ``record()`` builds its record's JSON object on
   the event loop (once: no ``RawRecord`` on the way, encoded once by the store); a record
   over 64 KiB is built by ``record_in_slices`` in a builder thread instead.
6. ``_writer.RecordWriter.submit`` queues it for one writer thread
   (``_runtime.batch.BatchThread``), which appends each batch with
   ``store.CaptureStore.append_many``: every file written under its flock, then synced.
7. ``store._group_commit.finish``: ``os.fsync(sync.fd)`` returns, and the record is durable.
8. The held chunk goes out. A write that failed is logged, counted in ``/health`` and leaves
   the rollout's incomplete marker; the call is served all the same.

Whatever ends a call (the end of the answer, upstream breaking off, the client leaving, an
exception) ends it in exactly one record (``_CapturedCall.send``, ``raised``, ``returned``).
"""

from rollcap.server._app import ModelServerSettings, create_model_app
from rollcap.server._middleware import CaptureState
from rollcap.server._upstream import MODEL_TYPES

__all__ = ["MODEL_TYPES", "CaptureState", "ModelServerSettings", "create_model_app"]
