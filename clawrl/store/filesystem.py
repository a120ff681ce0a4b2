"""Which file system a path lives on, and the refusal of a store on a network file system.

SQLite's WAL mode keeps its readers' and writers' index in a memory-mapped `-shm` file, so every
process that opens the database must be on one host; SQLite's documentation says WAL does not work
over a network file system, whose byte-range locks are not reliable enough for SQLite in any
journal mode either. A `clawrl.db` on NFS, SMB, sshfs, 9p, CephFS, GlusterFS or Lustre can be
corrupted by a second host opening it, and nothing on the first host can tell. So a store opened
for writing there is refused (`network_refusal`): one host opens the store, from its local disk;
trainer ranks on other hosts share only the checkpoints (docs/scale.md).

`filesystem_of` is pure: the file system type of a path, read from a `/proc/self/mountinfo`
text (proc(5)): the mount whose mount point is the longest prefix of the resolved path; of two
mounts on one point, the later (the one on top). Where there is no mountinfo (not Linux), the type
is unknown and nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")

# Network and cluster file systems, as mountinfo names them (FUSE ones as "fuse.<name>").
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "9p",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ocfs2",
        "gfs2",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.ceph-fuse",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.lustre",
    }
)


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes (\\040 ...)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line, in the file's order."""
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue  # not a mountinfo line
        dash = fields.index("-", 6)  # optional fields (shared:N, master:N) end at the lone "-"
        if len(fields) > dash + 1:
            mounts.append((_unescape(fields[4]), fields[dash + 1]))
    return mounts


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def filesystem_of(mountinfo: str, path: str) -> str | None:
    """The file system type of the mount holding absolute, resolved `path` (None: no mount holds it)."""
    best: tuple[int, str] | None = None
    for point, fstype in _mounts(mountinfo):
        if _under(path, point) and (best is None or len(point) >= best[0]):
            best = (len(point), fstype)  # >=: a later mount on the same point hides the earlier
    return None if best is None else best[1]


def is_network(fstype: str | None) -> bool:
    return fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs"))


def network_refusal(db_path: Path, mountinfo_file: Path | None = None) -> str | None:
    """Why the store at `db_path` must not be opened for writing (it is on a network file system),
    or None. The path need not exist yet: its existing part is resolved (symlinks followed).
    `mountinfo_file`: where to read the mounts (this process's, by default)."""
    try:
        mountinfo = (mountinfo_file or MOUNTINFO).read_text()
    except OSError:
        return None  # no /proc (not Linux): the type is unknown
    resolved = os.path.realpath(db_path)
    fstype = filesystem_of(mountinfo, resolved)
    if not is_network(fstype):
        return None
    return (
        f"the store {db_path} is on a network file system ({fstype}): SQLite's WAL mode does not "
        "work there and the database can be corrupted. Keep the run folder on a local disk of the "
        "one host that opens the store (the server, and the trainer's rank 0 beside it); trainer "
        "ranks on other hosts need only its checkpoints/ and trainer-group/ shared with them "
        "(docs/scale.md, docs/several-processes.md)"
    )
