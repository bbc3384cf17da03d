"""The capture directory: one append-only JSONL file per rollout, durable line by line.

``CaptureStore`` appends (flock, one write, fsync before returning) and reads tolerantly
(``_files``); threads appending to one file share one write and one fsync (``_group_commit``,
where a record's fsync happens). ``read_model_call_records`` and
``aggregate_model_call_metrics`` read one rollout back. ``check_capture_dir`` is the start-up
check that the directory's ``flock`` excludes other writers (``_shared``; the mount options it
reads are judged in ``_mounts``). Everything here blocks.
"""

from rollcap.store._files import (
    CAPTURE_SUFFIX,
    INCOMPLETE_SUFFIX,
    AvailableRecords,
    CaptureReadError,
    CaptureStore,
    aggregate_model_call_metrics,
    read_model_call_records,
)
from rollcap.store._shared import LOCK_PROBE_NAME, CaptureDirError, check_capture_dir, try_lock

__all__ = [
    "CAPTURE_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "LOCK_PROBE_NAME",
    "AvailableRecords",
    "CaptureDirError",
    "CaptureReadError",
    "CaptureStore",
    "aggregate_model_call_metrics",
    "check_capture_dir",
    "read_model_call_records",
    "try_lock",
]
