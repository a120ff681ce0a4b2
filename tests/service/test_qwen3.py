"""Qwen3 end to end on the local engine: the tiny Qwen3 (Qwen3's real tokenizer, chat template and
generation config, clawrl/model/tiny.py) served, rated and trained, through the real openai client
with the real trainer process beside the server. One server, three lines of versions: the admin's
rating makes `v1`, which the admin is then served; alice's and bob's make `alice/v1` and `bob/v1`
(an adapter per user, docs/users.md), each served to its own user alone. A batch of one: every
rating is a step."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from clawrl.eval.via_openclaw import OpenClawClient
from clawrl.store.db import Store
from tests.conftest import RemoteServer
from tests.timing import limit, wait_for

ADMIN = "admin-key-0123456789"
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, qwen3_model_dir):
    folder = tmp_path_factory.mktemp("qwen3")
    users = folder / "users.json"
    users.write_text(json.dumps(KEYS))
    args = [
        "--model", str(qwen3_model_dir), "--server.users", str(users), "--judge.backend", "feedback",
        "--train.enabled", "true", "--method", "rl", "--train.batch-size", "1", "--train.lr", "0.01",
        "--train.poll-s", "0.1", "--train.swap-poll-s", "0.1", "--train.nice", "0",
    ]  # fmt: skip
    s = RemoteServer(folder / "run", args, env={"CLAWRL_API_KEY": ADMIN})
    yield s
    s.stop()


def ask(server, key: str, text: str):
    messages = [{"role": "user", "content": text}]
    return server.client(api_key=key).chat.completions.create(model="clawrl", messages=messages, max_tokens=6)


def rate(server, key: str, answer_id: str, rating: int) -> None:
    body = {"response_id": answer_id, "rating": rating}
    headers = {"Authorization": f"Bearer {key}"}
    r = httpx.post(server.url + "/v1/feedback", json=body, headers=headers, timeout=limit(10))
    assert r.status_code == 200, r.text


def served(server, key: str, version: str):
    """A new answer to `key`, once it is made by `version` alone (None before; an answer the
    version reached mid-way records the one it started on too)."""
    answer = ask(server, key, "And now?")
    if answer.system_fingerprint != f"clawrl-{version.replace('/', '-')}":
        return None
    turn = wait_for(lambda: recorded(server, answer.id), 10, "the turn recorded")
    return answer if turn.versions == [version] else None


def recorded(server, turn_id: str):
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return store.get_turn(turn_id)


def users_of(server, sample_ids: list[int]) -> set[str]:
    db = sqlite3.connect(f"file:{server.run_dir / 'clawrl.db'}?mode=ro", uri=True)
    with closing(db):
        marks = ",".join("?" * len(sample_ids))
        return {u for (u,) in db.execute(f"SELECT user FROM samples WHERE id IN ({marks})", sample_ids)}


def test_qwen3_is_served_rated_and_its_v1_served(server, qwen3_model_dir):
    card = server.client(api_key=ADMIN).models.list().data[0].model_extra
    assert card["max_model_len"] == 4096 and card["reasoning"] is True  # Qwen3's hybrid template
    assert {k: card["sampling_defaults"][k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    answer = ask(server, ADMIN, "What is the capital of France?")
    assert answer.system_fingerprint == "clawrl-v0"
    turn = wait_for(lambda: recorded(server, answer.id), 10, "the turn recorded")
    tokenizer = AutoTokenizer.from_pretrained(qwen3_model_dir)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert turn.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert turn.temperature == pytest.approx(0.6) and len(turn.response_ids) >= 1
    rate(server, ADMIN, answer.id, 1)
    wait_for(lambda: served(server, ADMIN, "v1"), 120, "v1 served to the admin", every=0.2)
    # `clawrl eval --via openclaw` reads the card: OpenClaw's model entry is marked reasoning.
    assert asyncio.run(OpenClawClient(server.url, ADMIN, Path("openclaw"), server.run_dir / "oc").thinks())


def test_each_qwen3_user_gets_a_version_of_their_own(server):
    for who, key in KEYS.items():
        answer = ask(server, key, f"{who} asks a question")
        assert answer.system_fingerprint == "clawrl-v0"  # no version of their own yet
        rate(server, key, answer.id, 1)
    for who, key in KEYS.items():
        wait_for(lambda k=key, w=who: served(server, k, f"{w}/v1"), 120, f"{who}/v1 served", every=0.2)
        manifest = json.loads((server.run_dir / "checkpoints" / who / "v1" / "manifest.json").read_text())
        assert manifest["samples"] and users_of(server, manifest["samples"]) == {who}  # their samples alone
    assert ask(server, KEYS["alice"], "once more").system_fingerprint == "clawrl-alice-v1"
    assert ask(server, ADMIN, "the admin again").system_fingerprint == "clawrl-v1"  # the admin's own line
