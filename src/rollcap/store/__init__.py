"""The capture directory: one append-only JSONL file per rollout, durable line by line.

``CaptureStore`` appends (flock, one write, fsync before returning) and reads tolerantly
(``_files``); threads appending to one file share one write and one fsync (``_group_commit``,
where a record's fsync happens). A rollout's file may be compacted into
``<rollout_id>.capture.jsonl.zst`` (``CaptureStore.compact``; Zstandard frames, ``_frames``),
which every read finds as it finds the plain file. ``read_model_call_records`` and
``aggregate_model_call_metrics`` read one rollout back. ``check_capture_dir`` is the start-up
check that the directory's ``flock`` excludes other writers (``_shared``; the mount options it
reads are judged in ``_mounts``). Rollouts files that may be compressed are read and written
through ``_jsonl``. How ``append_many`` syncs a batch (an ``fsync`` per file or one ``syncfs``)
is ``_sync``'s choice. Everything here blocks.
"""

from rollcap.store._directory import DirectoryPass, compress_directory, decompress_directory
from rollcap.store._files import (
    CAPTURE_SUFFIX,
    COMPRESSED_CAPTURE_SUFFIX,
    INCOMPLETE_SUFFIX,
    AvailableRecords,
    CaptureConflictError,
    CaptureReadError,
    CaptureStore,
    aggregate_model_call_metrics,
    read_model_call_records,
)
from rollcap.store._frames import (
    DEFAULT_LEVEL,
    ZSTD_SUFFIX,
    check_level,
    is_compressed,
    plain_name,
)
from rollcap.store._jsonl import (
    CompressedFileError,
    FrameWriter,
    LineBatches,
    iter_lines,
    whole_frames_length,
)
from rollcap.store._shared import LOCK_PROBE_NAME, CaptureDirError, check_capture_dir, try_lock
from rollcap.store._sync import SYNC_MODES, check_sync

__all__ = [
    "CAPTURE_SUFFIX",
    "COMPRESSED_CAPTURE_SUFFIX",
    "DEFAULT_LEVEL",
    "INCOMPLETE_SUFFIX",
    "LOCK_PROBE_NAME",
    "SYNC_MODES",
    "ZSTD_SUFFIX",
    "AvailableRecords",
    "CaptureConflictError",
    "CaptureDirError",
    "CaptureReadError",
    "CaptureStore",
    "CompressedFileError",
    "DirectoryPass",
    "FrameWriter",
    "LineBatches",
    "aggregate_model_call_metrics",
    "check_capture_dir",
    "check_level",
    "check_sync",
    "compress_directory",
    "decompress_directory",
    "is_compressed",
    "iter_lines",
    "plain_name",
    "read_model_call_records",
    "try_lock",
    "whole_frames_length",
]
