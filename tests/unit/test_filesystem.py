"""A store on a network file system is refused (clawrl/store/filesystem.py): the file system type of
a path read from mountinfo texts, and `Store.open` and `clawrl serve` refusing one on NFS."""

from __future__ import annotations

import pytest

from clawrl.cli import main
from clawrl.store import filesystem
from clawrl.store.db import Store, StoreOnNetwork
from clawrl.store.filesystem import filesystem_of, is_network, network_refusal

# A workstation: ext4 root, a tmpfs, an NFS home with a local scratch folder mounted inside it,
# an sshfs mount and a mount point with a space (written \040), CIFS mounted twice on one point.
MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 27 0:27 / /dev/shm rw,relatime shared:3 - tmpfs tmpfs rw,size=24684092k
41 27 0:40 /export/home /home rw,relatime shared:20 - nfs4 10.0.0.1:/export/home rw,vers=4.2
42 41 259:1 / /home/ada/scratch rw,relatime shared:21 master:7 - xfs /dev/nvme0n1p1 rw
43 27 0:41 / /mnt/my\\040share rw,relatime - fuse.sshfs ada@host:/data rw,user_id=1000
44 27 0:42 / /srv/team rw,relatime - ext4 /dev/vdb rw
45 27 0:43 / /srv/team rw,relatime - cifs //fileserver/team rw,vers=3.1.1
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/", "ext4"),
        ("/work/runs/run1/clawrl.db", "ext4"),
        ("/dev/shm/x", "tmpfs"),
        ("/home", "nfs4"),
        ("/home/ada/run/clawrl.db", "nfs4"),
        ("/home/ada/scratch/run/clawrl.db", "xfs"),  # the local disk mounted inside the NFS home
        ("/home/ada/scratchy/clawrl.db", "nfs4"),  # a prefix of the name is not a mount point
        ("/mnt/my share/run/clawrl.db", "fuse.sshfs"),
        ("/srv/team/clawrl.db", "cifs"),  # the later of two mounts on one point is the one on top
        ("/srv/teamwork/clawrl.db", "ext4"),
    ],
)
def test_the_file_system_of_a_path_is_its_longest_mount_point_the_later_on_top(path, fstype):
    assert filesystem_of(MOUNTINFO, path) == fstype


def test_network_types_are_named_and_local_ones_are_not():
    for fstype in ("nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "9p", "ceph", "glusterfs", "lustre"):
        assert is_network(fstype), fstype
    for fstype in ("ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "fuse.portal", None):
        assert not is_network(fstype), fstype
    assert filesystem_of("", "/a") is None and filesystem_of("garbage line\n", "/a") is None


def _nfs_at(tmp_path, fstype="nfs4"):
    """A mountinfo file that mounts `tmp_path/share` with `fstype` over this machine's mounts."""
    share = tmp_path / "share"
    share.mkdir()
    here = filesystem.MOUNTINFO.read_text() if filesystem.MOUNTINFO.exists() else ""
    info = tmp_path / "mountinfo"
    info.write_text(here + f"999 1 0:99 / {share.resolve()} rw - {fstype} 10.0.0.1:/x rw\n")
    return share, info


def test_the_refusal_names_the_path_the_type_and_what_to_do(tmp_path):
    share, info = _nfs_at(tmp_path)
    db = share / "run" / "clawrl.db"  # not there yet: the run folder's parent decides
    refused = network_refusal(db, info)
    assert refused is not None
    assert str(db) in refused and "(nfs4)" in refused
    assert "local disk" in refused and "docs/scale.md" in refused
    assert network_refusal(tmp_path / "local" / "clawrl.db", info) is None
    link = tmp_path / "link"
    link.symlink_to(share, target_is_directory=True)  # a symlink into the share is followed
    assert network_refusal(link / "clawrl.db", info) is not None


def test_store_open_and_clawrl_serve_refuse_a_store_on_nfs_writing_nothing(tmp_path, monkeypatch, capsys):
    share, info = _nfs_at(tmp_path)
    monkeypatch.setattr(filesystem, "MOUNTINFO", info)  # this process's mounts, and an NFS share
    run = share / "run"
    with pytest.raises(StoreOnNetwork, match="network file system"):
        Store.open(run / "clawrl.db")
    assert not run.exists()
    assert main(["serve", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"the store {run / 'clawrl.db'} is on a network file system (nfs4)" in err
    assert not run.exists()  # no lock, no config.json
    Store.open(tmp_path / "local" / "clawrl.db").close()  # a local disk still opens
