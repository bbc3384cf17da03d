"""Seeing a run: a capture directory's rollouts as OpenTelemetry GenAI traces.

``export_otel(directory, rollouts=..., content=...)`` sends one trace per rollout attempt over
OTLP/HTTP (the ``otel`` extra: ``pip install 'rollcap[otel]'``; without it ``OtelUnavailable``)
and returns an ``OtelExportResult``. The mapping it uses is pure and needs no extra:
``rollout_spans`` turns one rollout's raw records into ``SpanData`` values, with ids derived from
the directory's run key (``run_key_of``) so that exporting twice gives the same ids.
"""

from rollcap.report._otel_export import (
    OTEL_INSTALL_HINT,
    RUN_KEY_FILE,
    OtelExportResult,
    OtelUnavailable,
    export_otel,
    read_rollout_infos,
    run_key_of,
)
from rollcap.report._otel_map import (
    ContentMode,
    ExportOptions,
    RolloutInfo,
    SpanData,
    SpanEventData,
    rollout_spans,
)

__all__ = [
    "OTEL_INSTALL_HINT",
    "RUN_KEY_FILE",
    "ContentMode",
    "ExportOptions",
    "OtelExportResult",
    "OtelUnavailable",
    "RolloutInfo",
    "SpanData",
    "SpanEventData",
    "export_otel",
    "read_rollout_infos",
    "rollout_spans",
    "run_key_of",
]
