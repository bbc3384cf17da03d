"""Whether a mount's ``flock`` excludes writers on other hosts, from its mountinfo line (pure).

The store's guarantee that appends from several model servers never interleave rests on
``flock``. On one host every local filesystem honours it. Across hosts only some network
filesystems do, and some mount options turn that off without a word:

- NFS (``nfs``, ``nfs4``): the Linux client emulates ``flock`` with a whole-file POSIX lock on
  the server (NLM on v3, LOCK on v4) unless the mount says ``nolock`` or ``local_lock=flock`` or
  ``local_lock=all``; then a lock excludes only processes of the same client. ``soft`` lets an
  append fail with EIO when the server stalls, and ``async`` (on the export) acknowledges a
  commit before it is on disk: both are warned about.
- Lustre: cluster-wide only with ``flock``; ``localflock`` is host-local, ``noflock`` refuses.
- FUSE (s3fs, gcsfuse, ...): no lock reaches the other hosts.
- GPFS and CephFS lock across hosts; any other filesystem is one host's own disk.

``judge`` states what a capture directory on that mount allows; ``parse_mountinfo`` and
``mount_for`` read ``/proc/self/mountinfo`` text, handed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Mount", "Verdict", "judge", "mount_for", "parse_mountinfo", "syncfs_commits"]

_NFS = frozenset({"nfs", "nfs4"})
# Filesystems whose flock is a lock on every host that mounts them (with the options above).
_CLUSTER_LOCKING = frozenset({"gpfs", "ceph"})
# Local filesystems whose ``syncfs`` writes back every dirty file, commits the journal and
# flushes the device before it returns, as an ``fsync`` of each file would (and where that was
# measured and crash-tested: bench/store.py, tests/store/test_power_loss.py). Elsewhere a
# ``syncfs`` may stop short of the server: a FUSE filesystem gets no request for it, and an NFS
# client's only writes back this host's pages.
_SYNCFS_COMMITS = frozenset({"ext4", "xfs"})


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where, what, and all its options."""

    mount_point: str
    fs_type: str
    source: str
    options: frozenset[str]  # the per-mount and the filesystem's (super block) options

    def option(self, name: str) -> str | None:
        """The value of ``name=value`` (``""`` for a bare ``name``), or None when absent."""
        for option in self.options:
            key, eq, value = option.partition("=")
            if key == name:
                return value if eq else ""
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a capture directory on a mount allows.

    ``refusals``: reasons appends from several hosts could interleave (shared use must stop).
    ``warnings``: reasons a record may be lost or not durable though appends stay whole.
    ``cross_host``: whether the filesystem is one other hosts can mount and lock at all.
    """

    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cross_host: bool = False


def _unescape(text: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def parse_mountinfo(text: str) -> list[Mount]:
    """Every well-formed line of ``/proc/<pid>/mountinfo``, in file order."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            dash = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < dash + 4:
            continue
        options = fields[5].split(",") + fields[dash + 3].split(",")
        mounts.append(
            Mount(
                mount_point=_unescape(fields[4]),
                fs_type=fields[dash + 1],
                source=_unescape(fields[dash + 2]),
                options=frozenset(o for o in options if o),
            )
        )
    return mounts


def mount_for(path: str, mounts: Iterable[Mount]) -> Mount | None:
    """The mount that holds the absolute, resolved ``path``: the longest mount point over it
    (the last one mounted, when several are stacked on one point)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        over = point == "/" or path == point or path.startswith(point + "/")
        if over and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def judge(mount: Mount) -> Verdict:
    """What ``mount`` allows a capture directory shared by several hosts."""
    fs_type = mount.fs_type
    where = f"{mount.mount_point} ({fs_type} from {mount.source})"
    if fs_type in _NFS:
        verdict = Verdict(cross_host=True)
        if mount.option("nolock") is not None:
            verdict.refusals.append(f"{where} is mounted with nolock: flock is local to each host")
        local_lock = mount.option("local_lock")
        if local_lock in ("flock", "all"):
            verdict.refusals.append(
                f"{where} is mounted with local_lock={local_lock}: flock is local to each host"
            )
        if mount.option("soft") is not None or mount.option("softerr") is not None:
            verdict.warnings.append(
                f"{where} is a soft mount: when the server stalls an append fails (EIO), the "
                "call is still served and its rollout is marked incomplete; use hard"
            )
        if mount.option("async") is not None:
            verdict.warnings.append(
                f"{where} is mounted async: a record may be acknowledged before the server "
                "has it on disk"
            )
        return verdict
    if fs_type == "lustre":
        verdict = Verdict(cross_host=True)
        if mount.option("flock") is None:
            kind = "localflock" if mount.option("localflock") is not None else "no flock option"
            verdict.refusals.append(
                f"{where} has {kind}: Lustre locks across hosts only when mounted with -o flock"
            )
        return verdict
    if fs_type == "fuse" or fs_type.startswith(("fuse.", "fuseblk")):
        return Verdict(
            refusals=[f"{where} is a FUSE filesystem: its flock does not reach other hosts"],
            cross_host=True,
        )
    if fs_type in _CLUSTER_LOCKING:
        return Verdict(cross_host=True)
    return Verdict()


def syncfs_commits(mount: Mount) -> bool:
    """Whether one ``syncfs`` on ``mount`` makes every file's written data durable."""
    return mount.fs_type in _SYNCFS_COMMITS
