"""Threads appending to one file share its writes and syncs, and none is left waiting."""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rollcap.store import (
    CaptureStore,
)
from tests.store._helpers import (
    PAYLOAD,
    open_file_paths,
)

THREADS = 16
THREAD_APPENDS = 200


def test_threads_share_one_store(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    other = CaptureStore(tmp_path)  # another descriptor on the same file, as another process
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(thread: int) -> None:
        try:
            barrier.wait()
            for seq in range(THREAD_APPENDS):
                target = other if thread == 0 and seq % 10 == 0 else store
                target.append("shared", {"thread": thread, "seq": seq})
                store.append(f"own-{thread % 4}", {"thread": thread, "seq": seq})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    shared = store.read("shared")  # strict: every line parses, no empty line between records
    assert len(shared) == THREADS * THREAD_APPENDS
    for t in range(THREADS):
        assert [r["seq"] for r in shared if r["thread"] == t] == list(range(THREAD_APPENDS))
    for own in range(4):
        assert len(store.read(f"own-{own}")) == THREADS // 4 * THREAD_APPENDS


def test_a_failed_batch_fails_every_line_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    real_write = os.write
    calls = {"n": 0}

    def slow_failing_write(fd: int, data: bytes | memoryview) -> int:
        time.sleep(0.002)  # let the other threads queue behind this write
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow_failing_write)
    barrier = threading.Barrier(8)
    written: list[int] = []
    failed: list[OSError] = []

    def work(thread: int) -> None:
        barrier.wait()
        for seq in range(20):
            try:
                store.append("0-0", {"n": thread * 100 + seq})
            except OSError as exc:
                failed.append(exc)
            else:
                written.append(thread * 100 + seq)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monkeypatch.setattr(os, "write", real_write)
    assert failed
    assert all(exc.errno == errno.EIO for exc in failed)
    assert len({id(exc) for exc in failed}) == len(failed)  # no exception shared by threads
    # A failed write wrote nothing, so exactly the lines reported written are in the file.
    assert sorted(r["n"] for r in store.read("0-0")) == sorted(written)
    assert len(written) + len(failed) == 8 * 20
    store.append("0-0", {"n": -1})
    assert store.read("0-0")[-1] == {"n": -1}


def _append_in_child(directory: str, path: str) -> None:
    assert path not in open_file_paths(), "the parent's cached descriptor was not closed"
    store = CaptureStore(directory)
    for seq in range(50):
        store.append("0-0", {"writer": "child", "seq": seq, "pad": "c" * PAYLOAD})


def test_fork_does_not_share_cached_descriptors(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", {"writer": "parent", "seq": -1})
    path = str(store.path_for("0-0"))
    assert path in open_file_paths()
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_append_in_child, args=(str(tmp_path), path))
    child.start()
    for seq in range(50):
        store.append("0-0", {"writer": "parent", "seq": seq, "pad": "p" * PAYLOAD})
    child.join(timeout=120)
    assert child.exitcode == 0
    store.append("0-0", {"writer": "parent", "seq": 50})
    records = store.read("0-0")
    assert [r["seq"] for r in records if r["writer"] == "parent"] == list(range(-1, 51))
    assert [r["seq"] for r in records if r["writer"] == "child"] == list(range(50))
    assert all(r.get("pad", "p" * PAYLOAD) in ("p" * PAYLOAD, "c" * PAYLOAD) for r in records)


class _Interrupted(Exception):
    pass


def test_an_interrupted_follower_strands_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CaptureStore(tmp_path)
    store.append("0-0", {"n": "first"})
    real_write = os.write
    writing, release = threading.Event(), threading.Event()

    def blocking_write(fd: int, data: bytes | memoryview) -> int:
        if not writing.is_set():
            writing.set()
            release.wait()
        return real_write(fd, data)

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    monkeypatch.setattr(os, "write", blocking_write)
    # Daemon threads: a stranded one fails the test instead of hanging the run.
    leader = threading.Thread(target=store.append, args=("0-0", {"n": "leader"}), daemon=True)
    leader.start()
    assert writing.wait(10)
    # Queues behind the main thread, which is waiting as a follower by then.
    later = threading.Timer(0.05, store.append, args=("0-0", {"n": "later"}))
    later.daemon = True
    later.start()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            store.append("0-0", {"n": "interrupted"})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    release.set()
    leader.join(10)
    later.join(10)
    assert not leader.is_alive()
    assert not later.is_alive()
    assert [r["n"] for r in store.read("0-0")] == ["first", "leader", "later"]
