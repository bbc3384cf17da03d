"""The capture directory: one append-only JSONL file per rollout, durable line by line.

``CaptureStore`` appends (flock, one write, fsync before returning) and reads tolerantly
(``_files``); threads appending to one file share one write and one fsync (``_group_commit``,
where a record's fsync happens). ``read_model_call_records`` and
``aggregate_model_call_metrics`` read one rollout back. Everything here blocks.
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

__all__ = [
    "CAPTURE_SUFFIX",
    "INCOMPLETE_SUFFIX",
    "AvailableRecords",
    "CaptureReadError",
    "CaptureStore",
    "aggregate_model_call_metrics",
    "read_model_call_records",
]
