"""Pruning version folders (`train.keep_versions`): the pure choice, then real folders written by the
trainer (a tiny model, full weights and LoRA), their export and rollback, and what always survives."""

from __future__ import annotations

import asyncio

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from clawrl.api.health import HealthReport
from clawrl.cli import main
from clawrl.config import Config, load_config, parse_overrides
from clawrl.engine.base import EngineStats
from clawrl.guard.recheck import recheck
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.train.loop import TrainLoop
from clawrl.train.policy import build_policy
from clawrl.train.prune import Pruning, choose
from clawrl.train.publish import export, rollback
from clawrl.types import HELD, PASSED, UNCHECKED, Sample, Version
from clawrl.version_folder import folder_bytes, pruned_files, weights_pruned

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]
FOLDER = "/run/checkpoints/{}"


def versions(*specs: str, **metrics: dict) -> list[Version]:
    """v0 (no folder), then one version per spec: 'p' passed, 'h' held, 'u' unchecked."""
    status = {"p": PASSED, "h": HELD, "u": UNCHECKED}
    rows = [Version("v0", 0)]
    for n, spec in enumerate(specs, start=1):
        name = f"v{n}"
        rows.append(Version(name, n, FOLDER.format(name), metrics.get(name, {}), status=status[spec]))
    return rows


# The pure choice.


def test_lora_prunes_only_optimizer_state_past_the_newest_k_and_the_served_one():
    chosen = choose(versions(*"pppppp"), served={"v2"}, keep=2, full=False)
    assert chosen == Pruning(optimizer=("v1", "v3", "v4"), weights=())


def test_full_weights_are_pruned_except_served_newest_held_named_and_unloadable():
    rows = versions(*"phpppppp", v6={"rollback_of": "v3"})  # v6: a rollback to v3
    chosen = choose(rows, served={"v5"}, keep=2, full=True, inspect={"v4"})
    assert chosen.optimizer == ("v1", "v2", "v3", "v4", "v6")
    # v2 held, v3 named by a rollback, v4 could not be loaded, v5 served, v7 and v8 the newest
    assert chosen.weights == ("v1", "v6")


def test_the_base_and_folderless_versions_are_never_named():
    rows = [*versions(*"ppp"), Version("v4", 1, None, {"rollback_of": "v0"})]  # LoRA rollback to v0
    assert choose(rows, served={"v4"}, keep=1, full=True) == Pruning(("v1", "v2"), ("v1", "v2"))
    assert choose(versions(), served={"v0"}, keep=1, full=True) == Pruning()


def test_fewer_versions_than_k_prune_nothing():
    assert choose(versions(*"pp"), served={"v2"}, keep=2, full=True) == Pruning()


def test_keep_versions_must_be_positive_and_the_error_names_it():
    with pytest.raises(ValidationError, match="train.keep_versions"):
        load_config(None, parse_overrides(["--train.keep-versions", "0"]))
    with pytest.raises(ValueError, match="train.keep_versions must be > 0"):
        choose(versions(*"p"), served=set(), keep=0, full=False)


# Real version folders, written by the trainer.


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    """A run folder with one session of 40 main turns served by v0, and a config that keeps 1 version."""
    config = Config(
        run_dir=tmp_path / "run",
        model={"path": str(tiny_model_dir)},
        train={
            "batch_size": 4,
            "lr": 1e-3,
            "poll_s": 0.01,
            "keep_versions": 1,
            "lora": {"rank": 4, "alpha": 8},
        },
    )
    config.run_dir.mkdir()
    config.write()
    with Store.open(config.run_dir / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        for i in range(40):
            store.insert_turn(make_turn(f"t{i}", "s1", i, created_at=10.0 + i, versions=["v0"]))
        yield config, store


def train(loop: TrainLoop, store: Store, steps: int) -> None:
    for _ in range(steps):
        start = store.count_samples("trained")
        samples = [
            Sample(
                f"t{i}", "rl", PROMPT[: 6 + i % 7], [4093 + i, 2], [-3.0, -3.0], loop.version, 1.0, reward=1.0
            )
            for i in range(start, start + 4)
        ]
        store.insert_samples(samples)
        assert loop.run_once()


def loop_for(config: Config, store: Store, canary=None) -> TrainLoop:
    loop = TrainLoop(
        store, build_policy(config.model.path, config.train, "cpu"), config.run_dir, canary=canary
    )
    loop.resume()
    return loop


def files(config: Config, version: str) -> set[str]:
    return {p.name for p in (config.run_dir / "checkpoints" / version).iterdir()}


def test_full_weights_past_k_are_pruned_and_export_names_the_kept_versions(run, tmp_path, capsys):
    config, store = run
    config.train.weights = "full"
    loop = loop_for(config, store)
    train(loop, store, 3)
    whole = {"config.json", "generation_config.json", "manifest.json", "model.safetensors", "optimizer.pt"}
    assert files(config, "v3") == whole
    for old in ("v1", "v2"):  # the manifest and config stay; the weights and optimizer state go
        assert files(config, old) == {"config.json", "generation_config.json", "manifest.json", "pruned.json"}
        assert pruned_files(config.run_dir / "checkpoints" / old) == ["model.safetensors", "optimizer.pt"]
    assert [v.name for v in store.versions()] == ["v0", "v1", "v2", "v3"]  # rows and history stay
    sizes = folder_bytes(config.run_dir)
    assert sizes["v1"] < 10_000 < sizes["v3"]

    out = export(store, config, "v3", tmp_path / "v3")
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(out)(input_ids=ids).logits
        assert torch.allclose(got, loop.policy.model(input_ids=ids).logits, atol=1e-5)
    args = ["export", "--merged", str(tmp_path / "v1"), "--version", "v1", "--run-dir", str(config.run_dir)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the weights of v1 were pruned (train.keep_versions)" in err and "kept: v0, v3" in err
    assert not (tmp_path / "v1").exists()
    with pytest.raises(ValueError, match="kept: v0, v3"):
        rollback(store, config, "v2")
    assert store.latest_version().name == "v3"  # the refused rollback published nothing
    with pytest.raises(ValueError, match="the weights of v1 were pruned"):
        next(recheck(config, store, ["v1"]))  # `clawrl canary v1`


def test_lora_adapters_stay_and_training_resumes_with_the_newest_optimizer_state(run, tmp_path):
    config, store = run
    loop = loop_for(config, store)
    train(loop, store, 3)
    assert files(config, "v1") == {
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
        "pruned.json",
    }
    assert "optimizer.pt" in files(config, "v3")
    assert not weights_pruned(config.run_dir / "checkpoints" / "v1")
    exported = export(store, config, "v1", tmp_path / "v1")  # any LoRA version exports
    assert (exported / "config.json").is_file()

    again = loop_for(config, store)
    assert again.version == "v3"
    a, b = loop.policy.optimizer.state_dict()["state"], again.policy.optimizer.state_dict()["state"]
    assert a and a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)
    rollback(store, config, "v1")  # its optimizer state is gone: the trainer goes on with a fresh one
    again.run_once()
    assert again.version == "v4" and not again.policy.optimizer.state_dict()["state"]


def test_served_held_and_rollback_named_versions_keep_their_weights(run):
    config, store = run
    config.train.weights = "full"
    verdicts = iter([UNCHECKED, HELD, UNCHECKED, UNCHECKED])

    def canary(policy):
        status = next(verdicts)
        return status, {"score": 0.5, "drop": 0.0, "kl": None, "seconds": 0.0, "reason": "test"}

    loop = loop_for(config, store, canary)
    train(loop, store, 1)  # v1
    rollback(store, config, "v1")  # v2: a copy of v1, so v1 is named by a rollback
    store.insert_turn(make_turn("served", "s1", 40, created_at=100.0, versions=["v2"]))  # the server is on v2
    train(loop, store, 3)  # v3 held; v4 from v2; v5 from v4
    kept = {"v1", "v2", "v3", "v5"}  # named by the rollback, served, held, newest
    for name in ("v1", "v2", "v3", "v4", "v5"):
        assert ("model.safetensors" in files(config, name)) == (name in kept), name
    assert [n for n in ("v1", "v2", "v3", "v4", "v5") if "optimizer.pt" in files(config, n)] == ["v2", "v5"]
    assert store.versions()[3].held and store.versions()[4].parent == "v2"

    body, code = asyncio.run(HealthReport(IdleEngine(), "clawrl", run_dir=config.run_dir).body())
    sizes = folder_bytes(config.run_dir)
    assert code == 200 and body["disk"] == {"total_bytes": sum(sizes.values()), "versions": sizes}
    assert list(sizes) == ["v1", "v2", "v3", "v4", "v5"] and sizes["v4"] < 10_000 < sizes["v1"]


class IdleEngine:
    """What /healthz reads of an engine."""

    version = "v5"

    def stats(self) -> EngineStats:
        return EngineStats()
