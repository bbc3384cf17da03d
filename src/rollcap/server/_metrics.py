"""The model server's Prometheus metrics (``GET /metrics``), in the official client's text format.

Each server has its own registry, so that servers in one process never share a series. Labels
are few-valued: dialect, status class, error category, phase; never a rollout or call id.

- ``rollcap_model_calls_total{dialect,status_class,error_category}``: calls ended; the error
  category is the record's with capture on, else the one the status and the end give;
- ``rollcap_model_call_latency_seconds``, ``..._ttft_seconds``, ``..._upstream_silence_seconds``
  (the longest gap between two upstream chunks once the answer started), by dialect;
- ``rollcap_model_calls_in_flight{phase}``: open calls now;
- ``rollcap_capture_records_written_total``, ``rollcap_capture_failures_total``,
  ``rollcap_uncorrelated_calls_total``: the ``/health`` counters;
- ``rollcap_capture_fsync_seconds``: each capture file sync (or a batch's one ``syncfs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _exposition
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rollcap.records import error_category
from rollcap.server._inflight import NO_ERROR, OpenCall
from rollcap.server._middleware import CaptureState

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


def status_class(status: int | None) -> str:
    return NO_ERROR if status is None else f"{status // 100}xx"


def _category(call: OpenCall) -> str:
    if call.error_category is not None:
        return call.error_category
    ok = call.status is not None and 200 <= call.status < 300
    category = error_category(
        call.status,
        cancelled=call.client_gone is not None,
        truncated=ok and not call.answered and call.client_gone is None,
    )
    return NO_ERROR if category is None else category.value


class _StateCollector(Collector):
    """The server's counters and open calls, read when scraped."""

    def __init__(self, state: CaptureState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        for name, doc, value in (
            ("rollcap_capture_records_written", "Capture records made durable.", state.captured),
            (
                "rollcap_capture_failures",
                "Capture records that could not be made durable.",
                state.capture_failures,
            ),
            (
                "rollcap_uncorrelated_calls",
                "Dialect calls without the /ng-rollout/<id> prefix.",
                state.uncorrelated,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        phases = GaugeMetricFamily(
            "rollcap_model_calls_in_flight", "Model calls open now, by phase.", labels=["phase"]
        )
        for phase, count in state.inflight.by_phase().items():
            phases.add_metric([phase], count)
        yield phases


class ServerMetrics:
    """One model server's metrics; ``call_ended`` for each dialect call the server is done with,
    ``sync_timed`` (thread-safe) for each capture file sync."""

    def __init__(self, state: CaptureState) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self._calls = Counter(
            "rollcap_model_calls",
            "Model calls ended, by dialect, status class and error category.",
            ["dialect", "status_class", "error_category"],
            registry=registry,
        )
        self._latency = Histogram(
            "rollcap_model_call_latency_seconds",
            "From the request's arrival to the end of the call.",
            ["dialect"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._ttft = Histogram(
            "rollcap_model_call_ttft_seconds",
            "From the request's arrival to the first byte of the answer from upstream.",
            ["dialect"],
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self._silence = Histogram(
            "rollcap_model_call_upstream_silence_seconds",
            "The longest gap between two chunks from upstream, once the answer started.",
            ["dialect"],
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self._fsync = Histogram(
            "rollcap_capture_fsync_seconds",
            "Each capture file sync.",
            buckets=_FSYNC_BUCKETS,
            registry=registry,
        )
        registry.register(_StateCollector(state))
        # The children, looked up once: labels() takes a lock and builds a key every time.
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def call_ended(self, call: OpenCall) -> None:
        dialect = call.dialect
        self._child(self._calls, dialect, status_class(call.status), _category(call)).inc()
        end = call.ended
        if end is not None:
            self._child(self._latency, dialect).observe(end - call.started)
        if call.first_upstream_byte is not None:
            self._child(self._ttft, dialect).observe(call.first_upstream_byte - call.started)
            self._child(self._silence, dialect).observe(call.longest_silence)

    def sync_timed(self, seconds: float) -> None:
        self._fsync.observe(seconds)

    def exposition(self) -> bytes:
        return _exposition(self.registry)
