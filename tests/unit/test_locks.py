"""The run folder's locks (clawrl/store/locks.py): one holder at a time, which names itself, and a
lock that goes with its holder's open file (the kernel drops it when the process dies)."""

from __future__ import annotations

import os

import pytest

from clawrl.store.locks import SERVER_LOCK, FolderLocked, hold, holder


def test_a_held_lock_refuses_another_holder_naming_the_pid_and_is_free_once_closed(tmp_path):
    assert holder(tmp_path, SERVER_LOCK) is None  # no file yet
    held = hold(tmp_path, SERVER_LOCK, "clawrl serve")
    assert holder(tmp_path, SERVER_LOCK) == os.getpid()
    with pytest.raises(FolderLocked) as refused:
        hold(tmp_path, SERVER_LOCK, "clawrl serve")  # another open file: as another process would
    assert refused.value.pid == os.getpid()
    assert str(refused.value) == f"another clawrl serve (pid {os.getpid()}) holds {tmp_path}"
    held.close()
    assert holder(tmp_path, SERVER_LOCK) is None
    hold(tmp_path, SERVER_LOCK, "clawrl serve").close()  # free again
