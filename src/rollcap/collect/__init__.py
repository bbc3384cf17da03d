"""Rollout collection: run every task of an input file against an agent server.

``collect`` is the I/O shell; the modules it drives are usable on their own: planning and
resume bookkeeping (``plan_rollouts``, ``ResumeState``, and ``RequestParams``, what a run sets
in each rollout's Responses parameters), the output and failure lines
(``rollout_line``, which attaches the rollout's evidence, and ``failure_line``), the
aggregate metrics (``MetricsAccumulator``, ``AggregateMetrics``), the dispatch journal
(``DispatchJournal``), resume's record of the attempts that ran, and ``reattach``, which
rebuilds the evidence of a rollouts file from a capture directory (``rollcap capture
attach``). ``run_rollout`` is one rollout's dispatch and builds its line; a caller-provided
``Dispatch`` (collection across a cluster) runs the same ``run_rollout`` elsewhere.
"""

from rollcap.collect._aggregate import (
    AggregateMetrics,
    CollectionSummary,
    MetricsAccumulator,
    percentile,
)
from rollcap.collect._compact import CaptureCompactor
from rollcap.collect._journal import DispatchJournal, dispatched_path
from rollcap.collect._lines import (
    AgentAnswerError,
    check_agent_answer,
    failure_line,
    has_evidence,
    rollout_line,
)
from rollcap.collect._plan import (
    PARAMS_KEY,
    InputError,
    RequestParams,
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
    "PARAMS_KEY",
    "AgentAnswerError",
    "AgentCall",
    "AggregateMetrics",
    "CaptureCompactor",
    "CollectionSummary",
    "Dispatch",
    "DispatchJournal",
    "InputError",
    "MetricsAccumulator",
    "ProgressCallback",
    "ReattachSummary",
    "RequestParams",
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
    "has_evidence",
    "http_agent",
    "iter_tasks",
    "percentile",
    "plan_rollouts",
    "planned_count",
    "reattach",
    "reattach_line",
    "rollout_line",
    "run_rollout",
]
