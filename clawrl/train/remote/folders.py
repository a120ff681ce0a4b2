"""A version folder as one tar stream with its sha256, both ways between a trainer and its gateway.

    publish.json        (an upload only) {"version": the Version's fields but its path,
                                          "trained": the sample ids, "folder": whether one follows}
    folder/<file>       each file of the version folder (the folder is flat: version_folder.py)

Uncompressed: safetensors and optimizer state hardly compress. The receiver writes the stream to
a hidden file beside the version folders while hashing it, compares the sum with the one the sender
named, and only then reads it: a stream whose sum differs is deleted unread (`ChecksumMismatch`), so
nothing of it is announced. Unpacking takes regular files at the two places above only: no link,
no folder, no path out of the folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.train.remote.errors import ChecksumMismatch, UploadRefused

PUBLISH = "publish.json"
FOLDER = "folder/"
CHUNK = 1 << 20
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Packed:
    """A packed version: the tar's path (hidden, the caller deletes it) and its sha256."""

    path: Path
    sha256: str


def pack(folder: Path | None, meta: dict[str, Any] | None, into: Path) -> Packed:
    """Tar `meta` (as publish.json) and the files of `folder` into a hidden file in `into`."""
    into.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".pack-", suffix=".tar", dir=into)
    os.close(fd)
    path = Path(name)
    with tarfile.open(path, "w") as tar:
        if meta is not None:
            data = json.dumps(meta).encode()
            info = tarfile.TarInfo(PUBLISH)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for p in sorted(folder.iterdir()) if folder is not None else []:
            if p.is_file():
                tar.add(p, arcname=FOLDER + p.name, recursive=False)
    return Packed(path, file_sha256(path))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Incoming:
    """A tar stream being received into a hidden file in `into`, hashed as it is written."""

    def __init__(self, into: Path) -> None:
        into.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".incoming-", suffix=".tar", dir=into)
        self.path, self._file = Path(name), os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._hash.update(chunk)

    def finish(self, expected: str) -> Path:
        """The file, once its sum is `expected`; else UploadRefused, and the file is gone."""
        self._file.close()
        got = self._hash.hexdigest()
        if got != expected.strip().lower():
            self.discard()
            raise ChecksumMismatch(
                f"checksum mismatch: the stream's sha256 is {got}, the sender named {expected}"
            )
        return self.path

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def unpack(tar_path: Path, into: Path) -> dict[str, Any] | None:
    """Write the folder's files of `tar_path` into the folder `into`; return publish.json (None: none).
    UploadRefused for a member that is not one of them."""
    meta = None
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for member in tar:
                source = tar.extractfile(member) if member.isfile() else None
                if source is None:
                    raise UploadRefused(f"{member.name!r} is not a regular file: refused")
                if member.name == PUBLISH:
                    meta = json.loads(source.read())
                    continue
                name = member.name.removeprefix(FOLDER)
                if not member.name.startswith(FOLDER) or not _FILE_NAME.fullmatch(name):
                    raise UploadRefused(f"{member.name!r} is not a version folder's file: refused")
                with open(into / name, "wb") as out:
                    while chunk := source.read(CHUNK):
                        out.write(chunk)
    except (tarfile.TarError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UploadRefused(f"not a version's tar stream: {exc}") from None
    return meta
