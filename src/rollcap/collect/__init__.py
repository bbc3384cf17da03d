"""Rollout collection: run every task of an input file against an agent server.

``collect`` is the I/O shell; the modules it drives are pure and usable on their own:
planning and resume bookkeeping (``plan_rollouts``, ``ResumeState``), the output and failure
lines and the trajectory projection (``rollout_line``, ``failure_line``, ``with_trajectory``),
and the aggregate metrics (``MetricsAccumulator``); the dispatch journal (``DispatchJournal``)
is resume's record of the attempts that ran. ``run_rollout`` is one rollout's dispatch, which a
caller-provided ``Dispatch`` (collection across a cluster) runs elsewhere.
"""

from rollcap.collect._aggregate import CollectionSummary, MetricsAccumulator, percentile
from rollcap.collect._journal import DispatchJournal, dispatched_path
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
from rollcap.collect._runner import (
    AgentCall,
    Dispatch,
    ProgressCallback,
    RolloutOutcome,
    collect,
    http_agent,
    run_rollout,
)

__all__ = [
    "CAPTURE_KEY",
    "TRAJECTORY_KEY",
    "TRAJECTORY_SCHEMA_VERSION",
    "AgentAnswerError",
    "AgentCall",
    "CollectionSummary",
    "Dispatch",
    "DispatchJournal",
    "InputError",
    "MetricsAccumulator",
    "ProgressCallback",
    "ProjectionError",
    "ResumeState",
    "Rollout",
    "RolloutOutcome",
    "aggregate_metrics_path",
    "check_agent_answer",
    "collect",
    "count_tasks",
    "dispatched_path",
    "failure_line",
    "failures_path",
    "http_agent",
    "iter_tasks",
    "percentile",
    "plan_rollouts",
    "planned_count",
    "project_trajectory",
    "rollout_line",
    "run_rollout",
    "with_trajectory",
]
