"""rollcap on a Ray cluster: model-server replicas and collection across nodes.

Ray places rollcap's processes, starts them, watches them and says when one dies; it never
carries model traffic or capture records. Agents talk HTTP to model-server replicas, replicas
to the upstream, and records go to one shared capture directory under ``flock`` + ``fsync``, so
every guarantee of one machine holds on many (``docs/scale-out.md``).

- ``ReplicaSet`` (``_replicas``): the model server as plain Ray actors, each under its own
  uvicorn on its node's address; ``GET /servers`` lists the live ones.
- ``WorkerPool`` (``_workers``): long-lived async rollout workers on every node, which run a
  rollout and build its line on the node.
- ``RayDispatch`` (``_dispatch``): one rollout attempt to the worker next to the replica it
  sticks to; what dies with a node comes back *lost*, and runs again under a new attempt id.
- ``cluster_environment`` and ``cluster_collection`` (``_env``): ``rollcap env start --ray`` and
  ``rollcap eval run --ray``.

Ray is the optional extra ``rollcap[ray]``. This package imports it on first use of anything
but ``ClusterSettings`` and ``require_ray`` (PEP 562), so that ``--ray`` without the extra is a
one-line error naming the install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rollcap.cluster._settings import INSTALL_HINT, ClusterSettings, require_ray

if TYPE_CHECKING:
    from rollcap.cluster._actors import ACTOR_OPTIONS
    from rollcap.cluster._dispatch import RayDispatch
    from rollcap.cluster._env import (
        ClusterEnvironment,
        ClusterRun,
        cluster_collection,
        cluster_environment,
        connected,
    )
    from rollcap.cluster._replicas import REPLICA_OPTIONS, ModelReplica, ReplicaSet
    from rollcap.cluster._workers import WORKER_OPTIONS, RolloutWorker, WorkerPool

_ON_FIRST_USE = {
    "ACTOR_OPTIONS": "rollcap.cluster._actors",
    "RayDispatch": "rollcap.cluster._dispatch",
    **dict.fromkeys(
        (
            "ClusterEnvironment",
            "ClusterRun",
            "cluster_collection",
            "cluster_environment",
            "connected",
        ),
        "rollcap.cluster._env",
    ),
    **dict.fromkeys(("REPLICA_OPTIONS", "ModelReplica", "ReplicaSet"), "rollcap.cluster._replicas"),
    **dict.fromkeys(("WORKER_OPTIONS", "RolloutWorker", "WorkerPool"), "rollcap.cluster._workers"),
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require_ray()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ACTOR_OPTIONS",
    "INSTALL_HINT",
    "REPLICA_OPTIONS",
    "WORKER_OPTIONS",
    "ClusterEnvironment",
    "ClusterRun",
    "ClusterSettings",
    "ModelReplica",
    "RayDispatch",
    "ReplicaSet",
    "RolloutWorker",
    "WorkerPool",
    "cluster_collection",
    "cluster_environment",
    "connected",
    "require_ray",
]
