"""tailer/inputs/netfs.py: which filesystem holds a path, from mountinfo text; and the CLI switching to polling."""

from __future__ import annotations

from pathlib import Path

import pytest

from mstail.tailer.app import cli

from mstail.tailer.inputs import netfs
from mstail.tailer.config import Config

MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
40 22 0:35 / /nfs rw,relatime shared:20 - nfs4 srv:/export rw,vers=4.2,rsize=1048576
41 40 0:36 / /nfs/local\040scratch rw,relatime - ext4 /dev/sdb1 rw
42 22 0:37 / /lustre/job rw - lustre 10.0.0.1@o2ib:/fs rw
43 22 0:38 / /mnt/sshfs rw,nosuid master:7 - fuse.sshfs user@host:/data rw,user_id=0
44 22 0:39 / /mnt/cifs rw - cifs //srv/share rw
45 22 0:40 / /data rw - xfs /dev/sdc1 rw
46 45 0:41 / /data rw - nfs srv:/data rw
garbage line without the separator
"""


def test_parse_mountinfo_reads_points_types_and_escapes() -> None:
    mounts = netfs.parse_mountinfo(MOUNTINFO)
    assert ("/nfs", "nfs4") in mounts and ("/nfs/local scratch", "ext4") in mounts
    assert ("/mnt/sshfs", "fuse.sshfs") in mounts  # optional fields (master:7) before the separator
    assert len(mounts) == 9


@pytest.mark.parametrize(
    "path, fstype",
    [
        ("/nfs/job/output/log/rank_0/info.log", "nfs4"),
        ("/nfs/job/output/log/rank_*/info.log", "nfs4"),  # a glob: its static part decides
        ("/nfs/local scratch/train.log", None),  # a local disk mounted inside the NFS tree
        ("/lustre/job/worker_*.log", "lustre"),
        ("/lustre/jobs/x.log", None),  # a prefix of the name is not a parent directory
        ("/mnt/sshfs/a.log", "fuse.sshfs"),
        ("/mnt/cifs/a.log", "cifs"),
        ("/data/run/a.log", "nfs"),  # stacked on the same point: the last mount wins
        ("/home/me/run/a.log", None),
    ],
)
def test_network_fs_by_longest_mount_point(path: str, fstype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netfs.os.path, "realpath", lambda p: str(p))  # these paths do not exist here
    monkeypatch.setattr(netfs, "existing_ancestor", lambda p: Path(str(p).split("*")[0]).parent if "*" in str(p) else Path(p))
    assert netfs.network_fs(path, netfs.parse_mountinfo(MOUNTINFO)) == fstype


def test_a_path_that_does_not_exist_yet_uses_its_nearest_existing_ancestor(tmp_path: Path) -> None:
    assert netfs.existing_ancestor(tmp_path / "run" / "output" / "rank_*" / "info.log") == tmp_path
    mounts = [("/", "ext4"), (str(tmp_path.resolve()), "nfs4")]
    assert netfs.network_fs(tmp_path / "later" / "info.log", mounts) == "nfs4"


def test_this_machine_reads_its_own_mountinfo(tmp_path: Path) -> None:
    assert netfs.filesystem_of(tmp_path) is not None  # whatever it is, it is found (and it is not NFS here)


def test_serve_polls_by_itself_when_a_log_is_on_a_network_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake = tmp_path / "mountinfo"
    fake.write_text(f"22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:35 / {tmp_path.resolve()}/nfs rw - nfs4 srv:/x rw\n")
    monkeypatch.setattr(netfs, "MOUNTINFO", str(fake))
    (tmp_path / "nfs").mkdir()
    remote, local = str(tmp_path / "nfs" / "rank_*" / "info.log"), str(tmp_path / "local.log")
    parser = cli._build_parser()

    config = cli._config(parser.parse_args(["serve", "--log", remote, "--log", local]), logs=(remote, local))
    assert config.poll_s == Config.network_poll_s
    err = capsys.readouterr().err
    assert f"{remote} is on a network filesystem (nfs4)" in err and "local.log" not in err
    assert "reading every 1 s on a timer" in err

    assert cli._config(parser.parse_args(["serve", "--log", remote, "--poll", "3"]), logs=(remote,)).poll_s == 3.0  # --poll wins
    assert cli._config(parser.parse_args(["serve", "--log", local]), logs=(local,)).poll_s is None
    assert capsys.readouterr().err == ""
