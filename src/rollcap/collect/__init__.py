"""Rollout collection: run every task of an input file against an agent server.

``collect`` is the I/O shell; the modules it drives are usable on their own: planning and
resume bookkeeping (``plan_rollouts``, ``ResumeState``), the output and failure lines
(``rollout_line``, which attaches the rollout's evidence, and ``failure_line``), the
aggregate metrics (``MetricsAccumulator``, ``AggregateMetrics``), and ``reattach``, which
rebuilds the evidence of a rollouts file from a capture directory (``rollcap capture
attach``).
"""

from rollcap.collect._aggregate import (
    AggregateMetrics,
    CollectionSummary,
    MetricsAccumulator,
    percentile,
)
from rollcap.collect._lines import (
    AgentAnswerError,
    check_agent_answer,
    failure_line,
    has_evidence,
    rollout_line,
)
from rollcap.collect._plan import (
    InputError,
    ResumeState,
    Rollout,
    aggregate_metrics_path,
    count_tasks,
    failures_path,
    iter_tasks,
    plan_rollouts,
    planned_count,
)
from rollcap.collect._reattach import ReattachSummary, reattach, reattach_line
from rollcap.collect._runner import ProgressCallback, collect

__all__ = [
    "AgentAnswerError",
    "AggregateMetrics",
    "CollectionSummary",
    "InputError",
    "MetricsAccumulator",
    "ProgressCallback",
    "ReattachSummary",
    "ResumeState",
    "Rollout",
    "aggregate_metrics_path",
    "check_agent_answer",
    "collect",
    "count_tasks",
    "failure_line",
    "failures_path",
    "has_evidence",
    "iter_tasks",
    "percentile",
    "plan_rollouts",
    "planned_count",
    "reattach",
    "reattach_line",
    "rollout_line",
]
