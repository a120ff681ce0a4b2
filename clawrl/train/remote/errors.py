"""What goes wrong between a remote trainer and its gateway.

RemoteError          base (a RuntimeError)
├── TrainerRefused   the gateway refuses this trainer: a wrong key (401), no trainer routes (404)
├── TrainerBusy      another remote trainer holds the gateway's samples (its lease is alive)
├── UploadRefused    a version's tar is not a version folder
│   └── ChecksumMismatch  its sha256 is not the one the sender named
├── PublishConflict  the gateway's next version is not the one uploaded (published meanwhile),
│                    or the samples it names are no longer this trainer's: the step is dropped
└── NoFolder         a version has no folder to send (pruned, or never written)
"""

from __future__ import annotations


class RemoteError(RuntimeError):
    """Base of the remote trainer's errors."""


class TrainerRefused(RemoteError):
    """The gateway refuses this trainer (wrong key, no trainer routes): nothing was done."""


class TrainerBusy(RemoteError):
    """Another remote trainer holds the gateway's samples."""


class UploadRefused(RemoteError):
    """An uploaded version was refused before it was announced (checksum, format)."""


class ChecksumMismatch(UploadRefused):
    """A version's tar stream whose sha256 is not the one its sender named: refused unread."""


class PublishConflict(RemoteError):
    """The uploaded version cannot be published as named: the trainer drops the step."""


class NoFolder(RemoteError):
    """A version asked for has no folder on the gateway."""
