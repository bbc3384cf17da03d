"""The garbage collector of a long-running server: start-up frozen, young collections rare.

A server allocates a few hundred containers per call (parsed JSON, events, frames), and dozens
of calls are in flight at once: with the default first threshold (700) a young collection runs
every few calls and walks every in-flight call's objects, promoting them to older generations
that are walked again. At 20,000 most of a call's objects are freed before any collection sees
them. Every process that serves calls sets this once it has started (the commands, and the
model-server replicas and rollout workers on a cluster).
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "freeze_startup"]

GC_THRESHOLDS = (20_000, 20, 20)


def freeze_startup() -> None:
    """Keep what a started server has built so far out of every later garbage collection.

    Modules, apps and settings live as long as the process; without this each full collection
    walks them all again. The garbage there is now is collected first, so none of it is kept.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
