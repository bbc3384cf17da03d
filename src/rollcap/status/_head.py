"""What the head server keeps of the collections that report to it: each run's latest status
document, for ``GET /status`` and its ``/metrics``.

A collection tells it with ``PUT /status`` about once a second. The newest ``RUNS_KEPT`` runs
are kept (by their ``run.id``), each as the bytes it sent and the few numbers the metrics read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rollcap.status._board import DOCUMENT_SCHEMA

__all__ = ["MAX_DOCUMENT_BYTES", "RUNS_KEPT", "HeadStatus", "StatusRefused"]

RUNS_KEPT = 16
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
_COUNTS = ("planned", "skipped", "running", "done", "failed", "lost", "retried")


class StatusRefused(ValueError):
    """A status document the head server does not take; ``str()`` says why."""


class HeadStatus(Collector):
    """The runs' latest documents; also the collector of the head's ``/metrics``."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[bytes, dict[str, Any]]] = OrderedDict()
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def put(self, data: bytes) -> None:
        """Keep ``data``, a run's status document, in place of that run's last one."""
        if len(data) > MAX_DOCUMENT_BYTES:
            raise StatusRefused(f"a status document is at most {MAX_DOCUMENT_BYTES} bytes")
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise StatusRefused(f"not JSON: {exc}") from None
        run = document.get("run") if isinstance(document, dict) else None
        if not (isinstance(run, dict) and isinstance(run.get("id"), str)):
            raise StatusRefused("not a status document: no run.id")
        if document.get("schema") != DOCUMENT_SCHEMA:
            raise StatusRefused(
                f"status document schema {document.get('schema')!r}, expected {DOCUMENT_SCHEMA}"
            )
        summary = {
            "finished": bool(run.get("finished")),
            "counts": document.get("counts") or {},
            "states": document.get("states") or {},
        }
        self._runs[run["id"]] = (data, summary)
        self._runs.move_to_end(run["id"])
        while len(self._runs) > RUNS_KEPT:
            self._runs.popitem(last=False)

    def body(self) -> bytes:
        """``{"runs": [...]}``: the documents, the most recently told first."""
        documents = [data for data, _ in reversed(self._runs.values())]
        return b'{"runs":[' + b",".join(documents) + b"]}"

    def collect(self) -> Iterator[Metric]:
        rollouts = GaugeMetricFamily(
            "rollcap_collection_rollouts",
            "Rollouts of the collections reporting to this head server, by count.",
            labels=["count"],
        )
        running = GaugeMetricFamily(
            "rollcap_collection_running_rollouts",
            "Running rollouts of the collections reporting to this head server, by state.",
            labels=["state"],
        )
        runs = GaugeMetricFamily(
            "rollcap_collection_runs", "Collections reporting, by whether they finished.",
            labels=["finished"],
        )  # fmt: skip
        totals = dict.fromkeys(_COUNTS, 0)
        states: dict[str, int] = {}
        finished = {"true": 0, "false": 0}
        for _, summary in self._runs.values():
            finished["true" if summary["finished"] else "false"] += 1
            for key in _COUNTS:
                value = summary["counts"].get(key)
                totals[key] += value if isinstance(value, int) else 0
            for state, value in summary["states"].items():
                if isinstance(value, int):
                    states[str(state)] = states.get(str(state), 0) + value
        for key, value in totals.items():
            rollouts.add_metric([key], value)
        for state, value in states.items():
            running.add_metric([state], value)
        for key, value in finished.items():
            runs.add_metric([key], value)
        yield rollouts
        yield running
        yield runs

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST
