"""An adapter per user on one live server (docs/users.md): alice's ratings train `alice/v1`, bob's
`bob/v1`, each from their own samples alone; each user's next answer is made by their own version
(`system_fingerprint`, and the versions the turn records), while the admin key is still served the
base. Then each is erased while the server serves and trains (the admin's DELETE /v1/users/NAME/data,
`clawrl users erase` beside the server) and goes on from v0. Through the real openai client, with the
real trainer process beside the server."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing

import httpx
import pytest

from clawrl.cli import main
from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT, RemoteServer
from tests.timing import limit, wait_for

ADMIN = "admin-key-0123456789"
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}
BATCH = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("adapters")
    users = folder / "users.json"
    users.write_text(json.dumps(KEYS))
    args = [
        "--model", str(tiny_model_dir), "--server.users", str(users), "--judge.backend", "feedback",
        "--train.enabled", "true",
        "--method", "rl", "--train.batch-size", str(BATCH), "--train.lr", "0.01", "--train.poll-s", "0.1",
        "--train.swap-poll-s", "0.1", "--train.nice", "0", "--guard.enabled", "false",
    ]  # fmt: skip
    s = RemoteServer(folder / "run", args, env={"CLAWRL_API_KEY": ADMIN})
    yield s
    s.stop()


def ask(server, key: str, text: str):
    client = server.client(api_key=key)
    messages = [{"role": "user", "content": text}]
    return client.chat.completions.create(model="clawrl", messages=messages, max_tokens=4, temperature=1.0)


def rate(server, key: str, answer_id: str, rating: int) -> None:
    body = {"response_id": answer_id, "rating": rating}
    r = httpx.post(
        server.url + "/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=limit(10)
    )
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def trained(server):
    """Each user asks BATCH questions and rates every answer: one full batch each, so one version each."""
    answers = {
        who: [ask(server, KEYS[who], f"{who} asks question {i}") for i in range(BATCH)] for who in KEYS
    }
    for who, mine in answers.items():
        assert {a.system_fingerprint for a in mine} == {"clawrl-v0"}  # no version of their own yet: the base
        for i, a in enumerate(mine):
            rate(server, KEYS[who], a.id, 1 if i % 2 else -1)

    def published():
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            names = {v.name for v in store.versions(None)}
        return names if {"alice/v1", "bob/v1"} <= names else None

    names = wait_for(published, 60, "alice/v1 and bob/v1 published")
    assert names == {"v0", "alice/v1", "bob/v1"}  # nothing for the admin's own line, no v1
    return answers


def test_each_users_samples_make_that_users_version_alone(server, trained):
    db = sqlite3.connect(f"file:{server.run_dir / 'clawrl.db'}?mode=ro", uri=True)
    with closing(db):
        rows = db.execute("SELECT id, turn_id, user, status FROM samples").fetchall()
    sample_of = {
        who: {i for i, turn, _, _ in rows if turn in {a.id for a in mine}} for who, mine in trained.items()
    }
    assert all(sample_of.values())
    assert {(user, status) for _, _, user, status in rows} == {("alice", "trained"), ("bob", "trained")}
    for who, other in (("alice", "bob"), ("bob", "alice")):
        manifest = json.loads((server.run_dir / "checkpoints" / who / "v1" / "manifest.json").read_text())
        assert set(manifest["samples"]) == sample_of[who]
        assert not set(manifest["samples"]) & sample_of[other]  # alice's samples never in bob's version


def test_each_user_is_answered_by_their_own_version(server, trained):
    def served(who: str, version: str):
        answer = ask(server, KEYS[who], f"{who} asks again")
        return answer if answer.system_fingerprint == f"clawrl-{version}" else None

    alice = wait_for(lambda: served("alice", "alice-v1"), 60, "alice served alice/v1", every=0.2)
    bob = wait_for(lambda: served("bob", "bob-v1"), 60, "bob served bob/v1", every=0.2)
    assert ask(server, KEYS["alice"], "and once more").system_fingerprint == "clawrl-alice-v1"
    assert ask(server, ADMIN, "the admin asks").system_fingerprint == "clawrl-v0"  # the default line: v0
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        assert wait_for(lambda: store.get_turn(bob.id), 10, "bob's turn recorded").versions == ["bob/v1"]
        assert wait_for(lambda: store.get_turn(alice.id), 10, "alice's turn recorded").versions == [
            "alice/v1"
        ]


MARKER = "quartz-zebra-7719"  # only alice ever sends it


def export(run_dir, capsys, *extra: str) -> str:
    capsys.readouterr()
    assert main(["records", "export", "--run-dir", str(run_dir), *extra]) == 0
    return capsys.readouterr().out


def erase(server, key: str, name: str) -> httpx.Response:
    url = f"{server.url}/v1/users/{name}/data"
    return httpx.delete(url, headers={"Authorization": f"Bearer {key}"}, timeout=limit(120))


def test_a_user_erased_while_serving_leaves_nothing_and_goes_on_from_v0(server, trained, capsys):
    """The admin's DELETE /v1/users/alice/data while the server serves and trains (docs/users.md):
    nothing of alice's is left in the records, the database's bytes or checkpoints/, bob's records
    and version are as they were, and alice, still a user, is answered by v0 with nothing cached."""
    wait_for(lambda: ask(server, KEYS["alice"], "hi").system_fingerprint == "clawrl-alice-v1", 60, "alice/v1")
    long = f"{MARKER} " + " ".join(f"w{i % 50}" for i in range(110))  # long enough to be cached
    client = server.client(api_key=KEYS["alice"])
    marked = client.chat.completions.create(
        model="clawrl", messages=[{"role": "user", "content": long}], max_tokens=4, temperature=0
    )
    assert marked.system_fingerprint == "clawrl-alice-v1"
    wait_for(lambda: MARKER in export(server.run_dir, capsys, "--user", "alice"), 10, "alice's turn recorded")
    bob_before = export(server.run_dir, capsys, "--user", "bob")

    assert erase(server, KEYS["alice"], "alice").status_code == 403  # a user's own key: the admin's job
    assert erase(server, KEYS["bob"], "alice").status_code == 403
    unknown = erase(server, ADMIN, "carol")
    assert unknown.status_code == 404 and "(the users: alice, bob)" in unknown.json()["error"]["message"]

    r = erase(server, ADMIN, "alice")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["user"] == "alice" and body["served"] == "v0" and body["checkpoints_removed"]
    assert body["erased"]["turns"] >= 3 and body["erased"]["versions"] >= 1
    assert body["shared_versions"] == []  # an adapter per user: no shared version learnt from her

    assert (
        MARKER not in export(server.run_dir, capsys)
        and export(server.run_dir, capsys, "--user", "alice") == ""
    )
    for db in server.run_dir.glob("clawrl.db*"):  # the database, its write-ahead log, its index
        assert MARKER.encode() not in db.read_bytes(), db.name
    assert not (server.run_dir / "checkpoints" / "alice").exists()
    assert export(server.run_dir, capsys, "--user", "bob") == bob_before
    assert (server.run_dir / "checkpoints" / "bob" / "v1" / "manifest.json").is_file()

    again = client.chat.completions.create(
        model="clawrl", messages=[{"role": "user", "content": long}], max_tokens=4, temperature=0
    )
    assert again.system_fingerprint == "clawrl-v0"  # her adapter is gone: the base answers
    assert again.usage.prompt_tokens_details.cached_tokens == 0  # her cached prompt too
    assert ask(server, KEYS["bob"], "still me").system_fingerprint == "clawrl-bob-v1"

    def health():
        r = httpx.get(
            server.url + "/healthz", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=limit(10)
        )
        return r.json()

    assert "alice" not in health()["engine"]["extra"]["adapters"]["served"]
    wait_for(lambda: health()["trainer"]["status"] == "running", 60, "the trainer started again")


def test_clawrl_users_erase_beside_a_running_server_goes_through_it(server, trained):
    """The command finds the server by its lock on the run folder and asks it, with the admin key
    from $CLAWRL_API_KEY: bob's data goes, and the server serves him v0; with a user's key the server
    refuses, and the command exits 2 with its reason."""

    def erase_bob(key: str) -> subprocess.CompletedProcess[str]:
        command = [*CLAWRL, "users", "erase", "bob", "--run-dir", str(server.run_dir), "--yes"]
        env = {**os.environ, "CLAWRL_API_KEY": key}
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit(180))

    refused = erase_bob(KEYS["bob"])
    assert refused.returncode == 2, refused.stderr
    assert "the server refused (403): erasing a user's data needs the admin key" in refused.stderr
    done = erase_bob(ADMIN)
    assert done.returncode == 0, done.stderr
    pid = (server.run_dir / "server.lock").read_text()
    assert f"a server (pid {pid}) serves {server.run_dir}: erasing through it" in done.stdout
    assert "erased bob's rows through" in done.stdout and "bob is served v0 from now on" in done.stdout
    assert not (server.run_dir / "checkpoints" / "bob").exists()
    assert ask(server, KEYS["bob"], "who am I?").system_fingerprint == "clawrl-v0"
