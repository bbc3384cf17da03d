from __future__ import annotations

import pytest

from rollcap.store._mounts import Mount, judge, mount_for, parse_mountinfo, syncfs_commits

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
40 27 0:50 / /shared rw,relatime - nfs4 fs1:/export rw,vers=4.2,hard,proto=tcp,sec=sys
41 27 0:51 / /shared/old rw - nfs fs2:/old rw,vers=3,nolock,proto=tcp
42 27 0:52 / /mnt/my\\040data rw - ext4 /dev/vdb rw
43 27 0:53 / /lustre rw - lustre mgs@tcp:/fs rw,flock
44 27 0:54 / /bucket rw,nosuid - fuse.s3fs s3fs rw,user_id=0
bad line without a separator
"""


def _nfs(options: str) -> Mount:
    return Mount("/shared", "nfs4", "fs1:/export", frozenset(options.split(",")))


def test_parse_reads_points_types_and_both_option_lists() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 7
    nfs = mounts[2]
    assert (nfs.mount_point, nfs.fs_type, nfs.source) == ("/shared", "nfs4", "fs1:/export")
    assert nfs.option("relatime") == ""
    assert nfs.option("vers") == "4.2"
    assert nfs.option("nolock") is None
    assert mounts[4].mount_point == "/mnt/my data"


@pytest.mark.parametrize(
    ("path", "point"),
    [
        ("/shared/run/calls", "/shared"),
        ("/shared/old/calls", "/shared/old"),
        ("/shared/older", "/shared"),  # a prefix of the name is not a parent directory
        ("/home/me/calls", "/"),
        ("/mnt/my data/x", "/mnt/my data"),
    ],
)
def test_the_mount_of_a_path_is_the_longest_mount_point_over_it(path: str, point: str) -> None:
    mount = mount_for(path, parse_mountinfo(MOUNTINFO))
    assert mount is not None
    assert mount.mount_point == point


def test_a_later_mount_on_the_same_point_hides_the_earlier() -> None:
    mounts = parse_mountinfo(MOUNTINFO + "50 27 0:60 / /shared rw - ext4 /dev/vdc rw\n")
    mount = mount_for("/shared/x", mounts)
    assert mount is not None
    assert mount.fs_type == "ext4"


def test_nfs_with_server_side_locks_is_accepted() -> None:
    verdict = judge(_nfs("rw,vers=4.2,hard,proto=tcp"))
    assert verdict.cross_host
    assert verdict.refusals == []
    assert verdict.warnings == []


@pytest.mark.parametrize(
    "options", ["rw,vers=3,nolock", "rw,vers=4.1,local_lock=flock", "rw,local_lock=all"]
)
def test_nfs_with_host_local_flock_is_refused(options: str) -> None:
    (reason,) = judge(_nfs(options)).refusals
    assert "flock is local to each host" in reason
    assert "/shared" in reason


def test_nfs_local_posix_locks_leave_flock_on_the_server() -> None:
    assert judge(_nfs("rw,local_lock=posix")).refusals == []
    assert judge(_nfs("rw,local_lock=none")).refusals == []


def test_soft_and_async_nfs_are_warned_about() -> None:
    verdict = judge(_nfs("rw,soft,async"))
    assert verdict.refusals == []
    assert [w.split(" is ")[1].split(":")[0] for w in verdict.warnings] == [
        "a soft mount",
        "mounted async",
    ]


def test_lustre_needs_its_flock_option() -> None:
    lustre = Mount("/l", "lustre", "mgs:/fs", frozenset({"rw", "flock"}))
    assert judge(lustre).refusals == []
    for options in ({"rw", "localflock"}, {"rw"}):
        (reason,) = judge(Mount("/l", "lustre", "mgs:/fs", frozenset(options))).refusals
        assert "-o flock" in reason


def test_fuse_is_refused_and_local_disks_are_one_host_s() -> None:
    (fuse,) = judge(Mount("/b", "fuse.gcsfuse", "bucket", frozenset())).refusals
    assert "FUSE" in fuse
    local = judge(Mount("/", "ext4", "/dev/vda", frozenset({"rw"})))
    assert not local.cross_host
    assert local.refusals == []
    assert local.warnings == []
    assert judge(Mount("/g", "gpfs", "gpfs0", frozenset())).cross_host


@pytest.mark.parametrize(
    ("fs_type", "commits"),
    [("ext4", True), ("xfs", True), ("nfs", False), ("fuse", False), ("tmpfs", False)],
)
def test_syncfs_counts_as_every_files_sync_only_on_ext4_and_xfs(
    fs_type: str, commits: bool
) -> None:
    assert syncfs_commits(Mount("/d", fs_type, "src", frozenset())) is commits
