"""What a comparison holds of a run: its benchmarks, their tasks and the rollouts' figures (pure).

Paths are kept as text: this module reads nothing (``_runs`` does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollcap.compare._lines import LineFigures

__all__ = ["Benchmark", "Side", "Task"]


@dataclass(slots=True)
class Task:
    """One task of a benchmark and its rollouts (repeats and attempts) in one run."""

    id: str
    key: bytes
    label: str
    task_index: int | None
    cluster: bytes | None
    rollouts: list[LineFigures] = field(default_factory=list)

    def mean(self, metric: str) -> float | None:
        """The mean of ``metric`` over the rollouts that report it."""
        values = [r.figures[metric] for r in self.rollouts if r.figures[metric] is not None]
        return sum(v for v in values if v is not None) / len(values) if values else None


@dataclass(slots=True)
class Benchmark:
    """One benchmark of a side: where it was read from and its tasks by key."""

    name: str
    rollouts_file: str
    capture_dir: str | None  # where its rollouts' capture files are; None: not found
    tasks: dict[bytes, Task] = field(default_factory=dict)
    rollouts: int = 0
    failed: int = 0
    unkeyed: int = 0  # lines no key names: counted, compared with nothing
    unreadable: int = 0

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "rollouts_file": self.rollouts_file,
            "capture_dir": self.capture_dir,
            "tasks": len(self.tasks),
            "rollouts": self.rollouts,
            "failed": self.failed,
            "unkeyed": self.unkeyed,
            "unreadable": self.unreadable,
        }


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison, as named and as read."""

    source: str
    benchmarks: list[Benchmark]
