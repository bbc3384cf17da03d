"""Cut the power under many concurrent calls: every call a client saw end has its record.

The capture directory is on a real ext4 or xfs, loop-mounted from an image that
``tests/store/_volatile_disk.py`` serves over FUSE. That disk keeps every write in memory until
the filesystem flushes it (the loop device's flush is an ``fsync`` of the image), and at the cut
throws away what was not flushed, as a disk with a volatile write cache loses it when the power
goes. After the cut the image as the disk kept it is mounted again (its journal replayed) and
read back.

One test per kept sync (``fsync`` of each file, one ``syncfs`` per batch) and filesystem, and the
control: the same run with every sync made a no-op must lose records, or the disk would not be
showing what a sync is for. ext4 is mounted with ``commit=30`` so that its five-second journal
timer cannot commit the control's writes before the cut; a sync commits at once either way.

Needs root, ``/dev/fuse``, Debian's fuse3 and xfsprogs, loop devices and ``mfusepy`` (all
installed by ``make test``); where one is missing the tests say which and skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from rollcap.store import CaptureStore
from rollcap.testing import FakeUpstream
from tests.server.conftest import client_headers, model_server, request_body, settings_for

DISK = Path(__file__).resolve().parent.parent / "store" / "_volatile_disk.py"
IMAGE_BYTES = 320 << 20  # xfs wants at least 300 MiB
CONCURRENT = 64
ROLLOUTS = 64
ANSWERED_FIRST = 50  # calls answered before the moment of the cut is drawn
MOUNT_OPTIONS = {"ext4": "commit=30", "xfs": "defaults"}
MKFS = {"ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"]}


def _missing(fs_type: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices and mounts)"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    for tool in ("fusermount3", "losetup", MKFS[fs_type][0]):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian's fuse3, util-linux, e2fsprogs, xfsprogs: make test)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse3 missing
        return f"needs mfusepy and libfuse3 ({exc}): make test installs them"
    return None


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


class VolatileFilesystem:
    """A filesystem on the volatile disk, mounted at ``root``; ``cut()`` pulls the plug."""

    def __init__(self, work: Path, fs_type: str) -> None:
        self.work = work
        self.fs_type = fs_type
        self.state, self.disk, self.root = work / "state", work / "disk", work / "fs"
        for directory in (self.state, self.disk, self.root):
            directory.mkdir()
        self.server: subprocess.Popen[bytes] | None = None
        self.log = work / "disk.log"

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, str(DISK), str(self.state), str(self.disk), str(IMAGE_BYTES)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while not (self.disk / "disk.img").exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the volatile disk did not start: {self.log.read_text()}")
            time.sleep(0.05)
        _run(*MKFS[self.fs_type], str(self.disk / "disk.img"))
        options = f"loop,{MOUNT_OPTIONS[self.fs_type]}"
        _run("mount", "-o", options, str(self.disk / "disk.img"), str(self.root))

    def cut(self) -> None:
        """The power goes: nothing written after this returns reaches the kept image."""
        fd = os.open(self.disk / "power", os.O_WRONLY)
        try:
            os.write(fd, b"cut")
        finally:
            os.close(fd)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _run("umount", str(self.root))
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _run("fusermount3", "-u", str(self.disk))
        if self.server is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(10)
            if self.server.poll() is None:
                self.server.kill()
                self.server.wait()

    @contextlib.contextmanager
    def after_the_cut(self) -> Iterator[Path]:
        """The filesystem as the disk kept it, mounted again (its journal replayed)."""
        self.stop()
        kept = self.work / "kept"
        kept.mkdir()
        _run("mount", "-o", "loop", str(self.state / "durable.img"), str(kept))
        try:
            yield kept
        finally:
            _run("umount", str(kept))


@contextlib.contextmanager
def volatile_filesystem(tmp_path: Path, fs_type: str) -> Iterator[VolatileFilesystem]:
    missing = _missing(fs_type)
    if missing is not None:
        pytest.skip(missing)
    fs = VolatileFilesystem(tmp_path, fs_type)
    try:
        fs.start()
        yield fs
    finally:
        fs.stop()


async def _load_then_cut(
    upstream: FakeUpstream, fs: VolatileFilesystem, sync: str, rng: random.Random
) -> set[str]:
    """Calls from 64 clients at once, streamed and not, over 64 rollouts, until the power is
    cut at a random moment; the calls whose answer a client had whole before the cut."""
    capture_dir = fs.root / "model-calls"
    settings = settings_for(upstream.url, capture_dir, capture_sync=sync)
    seen: set[str] = set()
    counter = iter(range(10**9))

    async def client(session: aiohttp.ClientSession, url: Callable[[str], str]) -> None:
        while True:
            n = next(counter)
            tag = f"call-{n}"
            stream = n % 3 == 0
            body = request_body("chat", stream=stream)
            body["messages"] = [{"role": "user", "content": tag}]
            async with session.post(
                url(f"r-{n % ROLLOUTS}"), json=body, headers=client_headers("chat")
            ) as response:
                data = await response.read()
                assert response.status == 200, data
                if stream:
                    assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
            seen.add(tag)  # the client has the whole answer

    async with model_server(settings) as base, aiohttp.ClientSession() as session:

        def url(rollout: str) -> str:
            return f"{base}/ng-rollout/{rollout}/v1/chat/completions"

        clients = [asyncio.create_task(client(session, url)) for _ in range(CONCURRENT)]
        # The cut falls at a random moment once calls are flowing, however slow the machine.
        deadline = time.monotonic() + 60
        while len(seen) < ANSWERED_FIRST and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(rng.uniform(0.0, 1.5))
        # No await between the two: no answer can be taken in between.
        before = set(seen)
        fs.cut()
        for task in clients:
            task.cancel()
        results = await asyncio.gather(*clients, return_exceptions=True)
    failures = [r for r in results if not isinstance(r, asyncio.CancelledError)]
    assert failures == [], failures
    return before


def _kept_tags(kept: Path) -> set[str]:
    store = CaptureStore(kept / "model-calls")
    tags: set[str] = set()
    for rollout in store.rollout_ids():
        for _, record in store.read_available(rollout).records:
            tags.add(record["request"]["messages"][0]["content"])
    return tags


@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
@pytest.mark.parametrize("sync", ["fsync", "syncfs"])
async def test_every_call_a_client_saw_end_is_on_disk_after_a_power_cut(
    upstream: FakeUpstream, tmp_path: Path, fs_type: str, sync: str
) -> None:
    seed = random.randrange(2**32)
    with volatile_filesystem(tmp_path, fs_type) as fs:
        answered = await _load_then_cut(upstream, fs, sync, random.Random(seed))
        with fs.after_the_cut() as kept:
            tags = _kept_tags(kept)
    assert len(answered) >= ANSWERED_FIRST, f"too few calls before the cut (seed {seed})"
    lost = answered - tags
    assert not lost, f"{len(lost)} of {len(answered)} answered calls lost (seed {seed})"


@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
async def test_without_a_sync_the_same_cut_loses_answered_calls(
    upstream: FakeUpstream, tmp_path: Path, fs_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sync(fd: int) -> None:
        pass

    # Every way the store makes a record durable, the directory's entries included.
    monkeypatch.setattr(os, "fsync", no_sync)
    monkeypatch.setattr("rollcap.store._files.syncfs", no_sync)
    seed = random.randrange(2**32)
    with volatile_filesystem(tmp_path, fs_type) as fs:
        answered = await _load_then_cut(upstream, fs, "auto", random.Random(seed))
        monkeypatch.undo()  # the mounts' own syncs are real
        with fs.after_the_cut() as kept:
            tags = _kept_tags(kept)
    assert len(answered) >= ANSWERED_FIRST
    assert len(answered - tags) > len(answered) // 2, (len(answered), len(tags), seed)
