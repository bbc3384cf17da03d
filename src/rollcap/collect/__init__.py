"""Rollout collection: run every task of an input file against an agent server.

``collect`` is the I/O shell; the modules it drives are pure and usable on their own:
planning and resume bookkeeping (``plan_rollouts``, ``ResumeState``), the output and failure
lines and the trajectory projection (``rollout_line``, ``failure_line``, ``with_trajectory``),
and the aggregate metrics (``MetricsAccumulator``).
"""

from rollcap.collect._aggregate import CollectionSummary, MetricsAccumulator, percentile
from rollcap.collect._lines import (
    CAPTURE_KEY,
    TRAJECTORY_KEY,
    TRAJECTORY_SCHEMA_VERSION,
    AgentAnswerError,
    ProjectionError,
    check_agent_answer,
    failure_line,
    project_trajectory,
    rollout_line,
    with_trajectory,
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
from rollcap.collect._runner import ProgressCallback, collect

__all__ = [
    "CAPTURE_KEY",
    "TRAJECTORY_KEY",
    "TRAJECTORY_SCHEMA_VERSION",
    "AgentAnswerError",
    "CollectionSummary",
    "InputError",
    "MetricsAccumulator",
    "ProgressCallback",
    "ProjectionError",
    "ResumeState",
    "Rollout",
    "aggregate_metrics_path",
    "check_agent_answer",
    "collect",
    "count_tasks",
    "failure_line",
    "failures_path",
    "iter_tasks",
    "percentile",
    "plan_rollouts",
    "planned_count",
    "project_trajectory",
    "rollout_line",
    "with_trajectory",
]
