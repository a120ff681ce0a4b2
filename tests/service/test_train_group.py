"""Several trainer ranks (accelerate, gloo on the CPU) make the same version as one process.

The real `clawrl train` command runs one step on a run folder's ready samples,
once alone and once as a group of 2 ranks launched through accelerate, on
copies of the same store. The published weights and the step's metrics must
agree within float tolerance: the samples are split across the ranks, the
gradients reduced by DDP, and the loss is still the step's token-level mean.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from clawrl.config import Config
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.train.group import FSDP_ON_CPU, split_by_tokens
from clawrl.types import Sample
from tests.conftest import CLAWRL, ROOT
from tests.timing import limit

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198, 30, 31, 32, 33, 34]


def samples() -> list[Sample]:
    """rl and opd samples of different prompt, hint and response lengths."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):
        n = 2 + 5 * (i % 3) + i  # 2 .. 17 response tokens
        response = torch.randint(100, 40000, (n,), generator=gen).tolist()
        prompt = PROMPT[: 6 + 2 * i]
        opd = i % 2 == 1
        out.append(
            Sample(
                turn_id=f"t{i}",
                kind="opd" if opd else "rl",
                prompt_ids=prompt,
                response_ids=response,
                logprobs=(-10.8 + 0.3 * torch.randn(n, generator=gen)).tolist(),  # near the tiny model's
                version="v0",
                temperature=[1.0, 0.7, 0.0][i % 3],
                reward=0.0 if opd else (1.0 if i % 4 == 0 else -1.0),
                teacher_prompt_ids=prompt + [520, 9531, 33 + i, 198] if opd else None,
            )
        )
    return out


def run_folder(
    tmp_path, name: str, model_dir, weights: str, strategy: str = "ddp", canary: bool = True
) -> Config:
    """A run folder with six ready samples; `canary` False: no canary gate (the DDP test compares
    the step, and the FSDP test the canary on sharded weights)."""
    config = Config(
        run_dir=tmp_path / name,
        model={"path": str(model_dir)},
        train={
            "weights": weights,
            "batch_size": 6,
            "lr": 1e-3,
            "micro_batch_tokens": 48,  # several micro-batches per rank: DDP reduces on the last only
            "nice": 0,
            "lora": {"rank": 4, "alpha": 8},
            "distributed": {"strategy": strategy},
        },
        guard={"enabled": canary},
    )
    config.run_dir.mkdir()
    config.write()
    with Store.open(config.run_dir / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        for i in range(6):
            store.insert_turn(make_turn(f"t{i}", "s1", i, created_at=10.0 + i))
        store.insert_samples(samples())
    return config


def train_one_step(config: Config, processes: int, step: int = 1) -> tuple[dict[str, torch.Tensor], dict]:
    """`clawrl train --steps 1` on the run folder (its `step`th version); v`step`'s weights and manifest."""
    cmd = [*CLAWRL, "train", "--run-dir", str(config.run_dir), "--steps", "1"]
    cmd += ["--train.distributed.num-processes", str(processes), "--train.threads", str(processes)]
    env = os.environ | {FSDP_ON_CPU: "1"}  # the FSDP path runs under gloo (refused on a CPU otherwise)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit(240), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folder = config.run_dir / "checkpoints" / f"v{step}"
    files = ["adapter_model.safetensors"] if config.train.weights == "lora" else ["model.safetensors"]
    weights = {k: v for f in files for k, v in load_file(folder / f).items()}
    manifest = json.loads((folder / "manifest.json").read_text())
    with Store.open(config.run_dir / "clawrl.db", readonly=True) as store:
        assert store.count_samples("trained") == 6 * step and store.count_samples("ready") == 0
        assert [v.name for v in store.versions()] == [f"v{n}" for n in range(step + 1)]
    return weights, manifest


def add_batch(config: Config, batch: int) -> None:
    """Six more samples for the next step, on new turns; the last one's answer three times as long.

    Two ranks then pack their shares unevenly (micro_batch_tokens 48): rank 0 two micro-batches
    (rl; the long opd alone), rank 1 three (opd and rl; opd; rl). Under FSDP rank 0 passes its
    last again at zero weight, and each rank joins a teacher pass it has no opd row for."""
    with Store.open(config.run_dir / "clawrl.db") as store:
        fresh = []
        for i, s in enumerate(samples()):
            turn = f"t{6 * batch + i}"
            store.insert_turn(make_turn(turn, "s1", 6 * batch + i, created_at=10.0 + 6 * batch + i))
            if i == 5:
                s = dataclasses.replace(s, response_ids=s.response_ids * 3, logprobs=s.logprobs * 3)
            fresh.append(dataclasses.replace(s, turn_id=turn))
        store.insert_samples(fresh)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_model_dir):
    """`one_process(weights, step)`: (run folder, weights, manifest) of one process's version `step`,
    trained once for the module (each `clawrl train` start imports torch and loads the model): the
    baseline both the DDP and the FSDP tests compare against."""
    runs: dict[str, tuple[Config, list[tuple[dict, dict]]]] = {}

    def get(weights: str, step: int) -> tuple[Config, dict[str, torch.Tensor], dict]:
        if weights not in runs:
            runs[weights] = (run_folder(tmp_path_factory.mktemp(weights), "one", tiny_model_dir, weights), [])
        config, versions = runs[weights]
        while len(versions) < step:
            if versions:
                add_batch(config, len(versions))
            versions.append(train_one_step(config, 1, len(versions) + 1))
        return config, *versions[step - 1]

    return get


def test_two_ranks_publish_the_same_version_as_one_process(tmp_path, tiny_model_dir, one_process):
    """DDP on LoRA. DDP's path does not depend on the weights trained (it wraps the model and
    reduces whatever requires a gradient); full weights in a group of ranks are the FSDP test's
    `full` case below, against the same one-process baseline. (A DDP `full` case cost the suite a
    two-rank run, ~60 s of one worker, and tested no line the two tests here do not.)"""
    weights = "lora"
    _, one, one_manifest = one_process(weights, 1)
    two, two_manifest = train_one_step(run_folder(tmp_path, "two", tiny_model_dir, weights, canary=False), 2)
    assert one.keys() == two.keys()
    moved = 0
    for key, value in one.items():
        # The OPD gap's student is each rank's own forward (packed and padded differently): float noise
        # of ~1e-7 in a near-zero gradient moves AdamW's first step by ~1e-6 (lr 1e-3): 1% of a step.
        torch.testing.assert_close(
            two[key], value, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}"
        )
        moved += "lora_B" in key and bool(value.any())
    assert moved > 0  # the step changed weights (LoRA B starts at zero; A is random from the start)
    m1, m2 = one_manifest["metrics"], two_manifest["metrics"]
    assert m1["tokens"] == m2["tokens"] and m1["samples_opd"] == m2["samples_opd"] == 3
    # The loss and the gradient norm (before clipping) see any scaling error of the ranks' shares.
    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "mismatch_exact"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
    assert m1["grad_norm"] > 0
    assert sorted(one_manifest["samples"]) == sorted(two_manifest["samples"])


@pytest.mark.parametrize("weights,step", [("lora", 2), ("full", 1)])
def test_two_fsdp_ranks_train_versions_as_one_process(tmp_path, tiny_model_dir, weights, step, one_process):
    """FSDP (torch's fully_shard, here under gloo): each rank holds half of every weight, gradient
    and optimizer state. The canary runs on both ranks together; the version is gathered to rank 0
    and written as one process writes it, and matches one process's. Full weights train v1 from the
    base (the loader cuts the full weights' shards at v0). With LoRA the group starts from a copy of
    one process's run folder at v1 (its store, weights and optimizer state: what the DDP test above
    shows two ranks make too), loads v1 into the shards, each rank cutting its own, and trains v2:
    a version loaded, trained and written again under FSDP. Each rank builds the model (and full
    fine-tuning's reference) on the meta device and reads its shards of the base from the checkpoint
    (train/meta_load.py). Full weights over several ranks publish bf16 weights for serving and save
    the training state sharded apart (train/saves.py, tests/service/test_sharded_saves.py): v1's bf16
    weights are one process's rounded, its AdamW state (read from the sharded save) one process's."""
    two = run_folder(tmp_path, "two", tiny_model_dir, weights, strategy="fsdp")
    if step > 1:
        one, *_ = one_process(weights, step - 1)
        shutil.copytree(one.run_dir, two.run_dir, dirs_exist_ok=True)
        two.write()  # its own run folder and strategy
        add_batch(two, step - 1)
    one, w1, m1 = one_process(weights, step)
    w2, m2 = train_one_step(two, 2, step)
    assert w1.keys() == w2.keys()
    for key, value in w1.items():
        # bf16 weights (full): at most one rounding step (2**-8) from one process's float32 ones
        want, tol = (value.to(torch.bfloat16).float(), 8e-3) if weights == "full" else (value, 1e-4)
        torch.testing.assert_close(
            w2[key].float(), want, rtol=tol, atol=1e-5, msg=lambda m, k=key: f"v{step} {k}: {m}"
        )
    for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens", "samples_opd"):
        assert m2["metrics"][key] == pytest.approx(m1["metrics"][key], rel=1e-4, abs=1e-7), key
    # The canary ran on the sharded weights: the same verdict and figures as one process's.
    assert m2["status"] == m1["status"] and m1["canary"] is not None
    for key in ("score", "accuracy", "kl"):
        assert m2["canary"][key] == pytest.approx(m1["canary"][key], rel=1e-3, abs=1e-6), key
    c1, c2 = m1["canary"]["collapse"], m2["canary"]["collapse"]  # rank 0's answers, packed on both ranks
    for key in ("entropy", "self_rouge_l", "drift"):
        assert c2[key] == pytest.approx(c1[key], rel=1e-3, abs=1e-6), key
    # Each rank's peak memory, rank 0 first (MiB: a Python process with torch is hundreds of them);
    # bench/fsdp_memory.py compares them with one process's on a model whose weights dominate.
    peaks = m2["metrics"]["peak_rss_mb"]
    assert len(peaks) == 2 and len(m1["metrics"]["peak_rss_mb"]) == 1
    assert all(100 < mb < 8192 for mb in peaks), peaks
    opt1 = torch.load(one.run_dir / "checkpoints" / f"v{step}" / "optimizer.pt")
    opt2 = optimizer_state(two, f"v{step}", tmp_path) if weights == "full" else None
    opt2 = opt2 or torch.load(two.run_dir / "checkpoints" / f"v{step}" / "optimizer.pt")
    assert opt1["state"].keys() == opt2["state"].keys() and opt1["state"]
    for i, state in opt1["state"].items():
        torch.testing.assert_close(opt2["state"][i]["exp_avg"], state["exp_avg"], rtol=1e-3, atol=1e-8)
        assert float(opt2["state"][i]["step"]) == float(state["step"]) == step


def optimizer_state(config: Config, version: str, tmp_path) -> dict:
    """A sharded save's AdamW state as one process's `optimizer.state_dict()` numbers it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from clawrl.train.saves import saves_dir
    from clawrl.train.shards import numbered

    dcp_to_torch_save(saves_dir(config.run_dir) / version, tmp_path / "state.pt")
    return numbered(torch.load(tmp_path / "state.pt", weights_only=False)["optim"])


def test_samples_are_split_across_ranks_by_tokens():
    assert split_by_tokens([10, 1, 1, 8, 2], 2) == [[0, 1], [2, 3, 4]]  # 11 and 11 tokens
    assert split_by_tokens([5, 5, 5], 3) == [[0], [1], [2]]
    assert split_by_tokens([3, 1], 1) == [[0, 1]]
    shares = split_by_tokens(list(range(1, 17)), 4)
    assert sorted(i for share in shares for i in share) == list(range(16))
    loads = [sum(i + 1 for i in share) for share in shares]
    assert max(loads) - min(loads) <= 1


def test_lockstep_ranks_split_their_micro_batches_to_make_as_many_passes():
    from clawrl.train.batch import even_out

    assert even_out([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert even_out([[0, 1, 2]], 3) == [[0], [1], [2]]  # the widest is halved until there are enough
    assert even_out([[0], [1]], 4) == [[0], [1]]  # one sample each: a zero-weight pass is left
    assert even_out([[0, 1], [2]], 2) == [[0, 1], [2]]  # enough already: unchanged


def test_a_batch_smaller_than_the_group_is_refused():
    with pytest.raises(ValueError, match="at least train.distributed.num_processes"):
        Config(train={"batch_size": 2, "distributed": {"num_processes": 3}})


def test_replay_in_a_group_of_ranks_is_refused_naming_both_settings():
    with pytest.raises(ValueError, match="replay_fraction > 0 runs in one trainer process only"):
        Config(train={"replay_fraction": 0.2, "distributed": {"num_processes": 2}})
