"""``SpanData`` as OpenTelemetry SDK spans, sent with the OTLP/HTTP exporter chunk by chunk.

This is the only module that imports OpenTelemetry (the ``otel`` extra); importing it without
the extra raises ``ImportError``, which ``_otel_export`` turns into ``OtelUnavailable``.

No ``TracerProvider`` and no batch processor: a batch processor queues at most 2,048 spans and
drops the rest with a log line, so a large directory would lose spans silently. Each chunk is
handed to ``OTLPSpanExporter.export`` directly and its result is the chunk's fate: the exporter
retries what the protocol calls transient (429, 502, 503, 504, lost connections) itself, within
its timeout, before it answers. Endpoint, headers, timeout, compression and TLS come from the
standard ``OTEL_EXPORTER_OTLP_*`` variables, which the exporter reads itself.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from rollcap.report._otel_map import SpanData

# The package's own metadata: ``rollcap.__version__`` is the public API's, a layer above.
_VERSION = importlib.metadata.version("rollcap")

__all__ = ["SpanSender", "traces_endpoint"]

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_DEFAULT_ENDPOINT = "http://localhost:4318/"


def traces_endpoint() -> str:
    """Where the exporter sends traces, by the variables' rule: the traces endpoint as given,
    else the base endpoint with ``v1/traces`` appended, else the local default."""
    specific = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if specific:
        return specific
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_ENDPOINT
    return base.rstrip("/") + "/v1/traces"


def _resource() -> Resource:
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win; without them the service is rollcap.
    resource = Resource.create()
    name = resource.attributes.get(SERVICE_NAME)
    if not isinstance(name, str) or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "rollcap"}))
    return resource


class SpanSender:
    """Sends chunks of spans; ``send`` answers whether the receiver took the chunk."""

    def __init__(self, exporter: SpanExporter | None = None) -> None:
        self._exporter = exporter if exporter is not None else OTLPSpanExporter()
        self._resource = _resource()
        self._scope = InstrumentationScope("rollcap", _VERSION)

    def _span(self, span: SpanData) -> ReadableSpan:
        parent = None
        if span.parent_span_id is not None:
            parent = SpanContext(span.trace_id, span.parent_span_id, False, _SAMPLED)
        status = (
            Status(StatusCode.ERROR, span.status_description)
            if span.error
            else Status(StatusCode.UNSET)
        )
        return ReadableSpan(
            name=span.name,
            context=SpanContext(span.trace_id, span.span_id, False, _SAMPLED),
            parent=parent,
            resource=self._resource,
            attributes=dict(span.attributes),
            events=[Event(e.name, dict(e.attributes), e.time_ns) for e in span.events],
            kind=_KINDS[span.kind],
            status=status,
            start_time=span.start_ns,
            end_time=span.end_ns,
            instrumentation_scope=self._scope,
        )

    def send(self, spans: Sequence[SpanData]) -> bool:
        result = self._exporter.export([self._span(span) for span in spans])
        return result is SpanExportResult.SUCCESS

    def close(self) -> None:
        self._exporter.shutdown()
