from __future__ import annotations

import gc

from rollcap._runtime.heap import GC_THRESHOLDS, freeze_startup


def test_a_started_server_freezes_what_it_built_and_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        freeze_startup()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
