"""`clawrl users erase NAME` through the real CLI (docs/users.md, "Removing a user"): alice, removed
from the users file, is erased (rows, memory, versions and their folder) while bob's and the default
user's records export exactly as before; every refusal exits 2 with one line and changes nothing."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.store.db import Store
from tests.unit.test_store_erase import SECRET, fill, others, recount, totals

FOLDERS = ("alice/v1", "alice/v2", "bob/v1", "v1")


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder: alice, bob and default in the store, alice no longer in the users file."""
    run = tmp_path / "run"
    with Store.open(run / "clawrl.db") as store:
        fill(store)
    for version in FOLDERS:
        (run / "checkpoints" / version).mkdir(parents=True)
        (run / "checkpoints" / version / "manifest.json").write_text(json.dumps({"version": version}))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"bob": "sk-bob-1"}))
    (run / "config.json").write_text(json.dumps({"server": {"users": str(users)}}))
    return run


class Terminal(io.StringIO):
    """A standard input someone types into."""

    def isatty(self) -> bool:
        return True


def erase(run: Path, name: str, *extra: str) -> int:
    return main(["users", "erase", name, "--run-dir", str(run), *extra])


def exported(run: Path, user: str, capsys) -> str:
    capsys.readouterr()
    assert main(["records", "export", "--user", user, "--run-dir", str(run)]) == 0
    return capsys.readouterr().out


def snapshot(run: Path) -> dict:
    """Every row of every user's, the running totals, and the version folders."""
    with Store.open(run / "clawrl.db", readonly=True) as store:
        tables = {t: store._read(f"SELECT count(*) FROM {t}")[0][0] for t in ("sessions", "versions")}
        return {"rows": others(store), "all": tables, "totals": totals(store), "folders": folders(run)}


def folders(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run / "checkpoints")) for p in (run / "checkpoints").glob("**/v*"))


def test_erase_removes_alice_and_leaves_bob_and_default_as_they_were(run, capsys):
    bob, default, alice = (exported(run, u, capsys) for u in ("bob", "default", "alice"))
    assert SECRET in alice and bob and default
    assert erase(run, "alice", "--yes") == 0
    out = capsys.readouterr().out
    assert "erased alice's rows" in out and "4 sessions, 7 turns, 1 feedback, 4 judgments" in out
    assert f"removed {run / 'checkpoints' / 'alice'}" in out
    assert exported(run, "bob", capsys) == bob and exported(run, "default", capsys) == default
    assert exported(run, "alice", capsys) == ""
    assert folders(run) == ["bob/v1", "v1"]
    with Store.open(run / "clawrl.db", readonly=True) as store:
        assert totals(store) == recount(store)
        assert store.experiences("alice") == [] and store.versions("alice")[-1].name == "v0"
    assert SECRET.encode() not in (run / "clawrl.db").read_bytes()


def test_erase_asks_first_and_a_yes_erases(run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert erase(run, "alice") == 0
    out = capsys.readouterr().out
    assert f"erase all of alice's data from {run}? [y/N]" in out and "erased alice's rows" in out
    assert folders(run) == ["bob/v1", "v1"]


@pytest.mark.parametrize("answer", ["\n", "n\n", "no\n", "whatever\n", ""])
def test_anything_but_yes_erases_nothing(run, capsys, monkeypatch, answer):
    before = snapshot(run)
    monkeypatch.setattr("sys.stdin", Terminal(answer))
    assert erase(run, "alice") == 1
    assert "nothing erased" in capsys.readouterr().out
    assert snapshot(run) == before


def refused(run: Path, capsys, name: str, *extra: str) -> str:
    """Erase `name`, which must be refused (exit 2, one line) leaving the run folder as it was."""
    db = run / "clawrl.db"
    before, raw = snapshot(run), db.read_bytes() if db.exists() else b""
    assert erase(run, name, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clawrl: error: ") and "\n" not in err
    assert snapshot(run) == before
    if name != "carol":  # refused before the store is opened: not a byte of it written
        assert (db.read_bytes() if db.exists() else b"") == raw
    return err


def test_the_default_user_is_refused(run, capsys):
    assert "default is the admin key's own user" in refused(run, capsys, "default", "--yes")


def test_a_user_still_in_the_users_file_is_erased_when_no_server_runs(run, capsys):
    """bob stays a user: the next server serves him v0, with nothing of his past (no server runs now,
    so the command erased in the store itself, holding the server's lock meanwhile)."""
    with Store.open(run / "clawrl.db", readonly=True) as store:
        assert any(store.user_rows("bob").values())
    assert erase(run, "bob", "--yes") == 0
    with Store.open(run / "clawrl.db", readonly=True) as store:
        assert not any(store.user_rows("bob").values())
    assert "bob/v1" not in folders(run) and exported(run, "bob", capsys) == ""


def test_an_unknown_user_is_refused_naming_the_users(run, capsys):
    err = refused(run, capsys, "carol", "--yes")
    assert f"no user carol in {run / 'clawrl.db'} (the users: alice, bob)" in err


def test_without_yes_a_standard_input_that_is_no_terminal_is_refused(run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # piped: nobody answered the question
    assert "give --yes" in refused(run, capsys, "alice")


@pytest.mark.parametrize("name", ["..", "v2", "Alice", "a/b"])
def test_a_name_that_is_no_users_is_refused(run, capsys, name):
    assert "is not a user's name" in refused(run, capsys, name, "--yes")


def test_a_run_folder_without_a_store_is_refused(tmp_path, capsys):
    (tmp_path / "checkpoints" / "alice" / "v1").mkdir(parents=True)
    assert erase(tmp_path, "alice", "--yes") == 2
    assert f"no clawrl.db in {tmp_path}" in capsys.readouterr().err
    assert (tmp_path / "checkpoints" / "alice" / "v1").is_dir()


def test_an_unreadable_users_file_is_refused(run, capsys, tmp_path):
    (tmp_path / "users.json").unlink()
    assert f"cannot read the users of {run}" in refused(run, capsys, "alice", "--yes")


def test_a_run_without_users_file_erases_and_a_folder_left_alone_is_found_again(run, capsys):
    (run / "config.json").write_text(json.dumps({"server": {"users": None}}))
    assert erase(run, "alice", "--yes") == 0
    (run / "checkpoints" / "alice" / "v3").mkdir(parents=True)  # left behind (say, unremovable then)
    assert erase(run, "alice", "--yes") == 0
    assert "0 sessions" in capsys.readouterr().out and folders(run) == ["bob/v1", "v1"]


def test_the_shared_policys_versions_trained_on_the_users_samples_are_named(run, capsys):
    """What a shared version learnt from alice stays in its weights: the erase says which versions."""
    with Store.open(run / "clawrl.db", readonly=True) as store:
        trained = sorted(store.trained_sample_ids("alice"))
    assert trained
    manifest = {"version": "v1", "samples": [trained[0], 10_000]}
    (run / "checkpoints" / "v1" / "manifest.json").write_text(json.dumps(manifest))
    assert erase(run, "alice", "--yes") == 0
    out = capsys.readouterr().out
    assert "kept: the shared policy's versions v1 were trained on their samples" in out
    assert folders(run) == ["bob/v1", "v1"]
