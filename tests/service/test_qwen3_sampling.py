"""A model folder shipping Qwen3's generation config (temperature 0.6, top_p 0.95, top_k 20), served
through vLLM and trained from: every turn a request leaves to the defaults is sampled from a cut
distribution, so its recorded logprobs are vLLM's processed ones, and the trainer weighs each of
its tokens by the truncated importance weight rather than taking it as on-policy.

At v0 the weight has a closed form. vLLM keeps the 20 likeliest tokens, then, of those
renormalised, the smallest set whose mass reaches 0.95 (sorted ascending, a token goes while the
running sum, itself included, is at most 0.05; the likeliest always stays). It samples from pi_T
renormalised over that set, so mu(a) = pi_T(a) / M with M the set's mass under pi_T, and
w = pi_T(a) / mu(a) = M <= 1 for every token drawn. The trainer's side is its own float32 forward
(a LoRA policy at v0 is the base); vLLM computes in bf16, hence the tolerance.

The served model is the embedded SmolLM2 (the session's one vLLM server); the folder the gateway
reads is the same files with Qwen3's generation_config.json in place of SmolLM2's.
"""

from __future__ import annotations

import json

import pytest
import torch

from clawrl.config import TrainConfig
from clawrl.store.db import Store
from clawrl.train.policy import build_policy
from clawrl.types import Sample
from tests.conftest import attach_gateway

pytestmark = pytest.mark.parametrize("engine", ["vllm"], scope="module")  # "[vllm]": the vLLM worker
QWEN3 = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}  # Qwen3-8B's, as shipped
ASK = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
TOLERANCE = 0.08  # mean |log w - log M| per token, bf16 against float32 (tests/service/test_importance.py)


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory, embedded_model_dir):
    folder = tmp_path_factory.mktemp("qwen3-sampling")
    for path in embedded_model_dir.iterdir():
        if path.name != "generation_config.json":
            (folder / path.name).symlink_to(path)
    (folder / "generation_config.json").write_text(json.dumps(QWEN3))
    return folder


@pytest.fixture(scope="module")
def served(request, engine, tmp_path_factory, qwen3_folder):
    run_dir = tmp_path_factory.mktemp("qwen3-vllm") / "run"
    server = attach_gateway(run_dir, request.getfixturevalue("vllm_gateway"), qwen3_folder)
    yield server
    server.stop()


def _kept_mass(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """M per position: the mass under softmax(logits) of what vLLM's top-k then top-p keep."""
    probs = torch.softmax(logits, -1)
    top = probs.topk(top_k, dim=-1).values.flip(-1)  # the k likeliest, ascending
    running = torch.cumsum(top / top.sum(-1, keepdim=True), -1)
    kept = running > 1 - top_p
    kept[:, -1] = True
    return (top * kept).sum(-1)


def test_qwen3_defaults_on_vllm_are_weighted_by_the_kept_mass_and_trained_so(served, qwen3_folder, engine):
    client = served.client()
    card = client.models.list().data[0].model_extra
    assert {k: card["sampling_defaults"][k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }, card
    answer = client.chat.completions.create(model="clawrl", messages=ASK, max_tokens=24)
    with Store.open(served.run_dir / "clawrl.db", readonly=True) as store:
        turn = store.get_turn(answer.id)
    assert turn is not None and len(turn.response_ids) >= 4, answer
    assert turn.temperature == pytest.approx(0.6)
    assert turn.sampling["top_k"] == 20 and turn.sampling["top_p"] == pytest.approx(0.95)
    assert not turn.logprobs_exact  # vLLM's processed logprobs: the behaviour mu, not pi_T

    policy = build_policy(qwen3_folder, TrainConfig(batch_size=1, lr=1e-6), "cpu")
    ids = torch.tensor([turn.prompt_ids + turn.response_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(turn.prompt_ids) - 1 : -1].float() / turn.temperature
    mass = _kept_mass(logits, 20, 0.95)
    assert (mass < 0.99).any()  # the cut removed something: a weight of 1 would not be by accident
    pi = torch.log_softmax(logits, -1).gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]
    log_w = pi - torch.tensor(turn.logprobs)
    assert (log_w - mass.log()).abs().mean() < TOLERANCE, (log_w, mass.log())

    sample = Sample(
        turn_id=turn.id,
        kind="rl",
        prompt_ids=turn.prompt_ids,
        response_ids=turn.response_ids,
        logprobs=turn.logprobs,
        version="v0",
        temperature=turn.temperature,
        reward=1.0,
        logprobs_exact=turn.logprobs_exact,
    )
    metrics = policy.trainer.step([sample])
    expected = log_w.exp().clamp(max=policy.cfg.is_cap)
    assert metrics["mismatch"] is not None and metrics["mismatch_tokens"] == len(turn.response_ids)
    assert metrics["is_unweighted_samples"] == 0  # weighted, not taken as on-policy
    assert metrics["is_weight_mean"] == pytest.approx(float(expected.mean()), abs=1e-3)
    assert metrics["is_weight_min"] == pytest.approx(float(expected.min()), abs=1e-3)
    assert metrics["is_weight_mean"] < 1.0  # the cut's mass, below 1 on average
