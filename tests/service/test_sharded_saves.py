"""Full fine-tuning over two ranks (FSDP or DDP, under gloo on the CPU) saves its training state sharded and
in the background (clawrl/train/saves.py), and a group that restarts from a save trains the step
the group that never stopped trains.

Run A trains two versions in one `clawrl train --steps 2`; run B trains the same samples with
`--steps 1` twice, its second group resuming from v1's sharded save. Their v2 saves (float32
weights and AdamW's moments) and v2 folders (bf16 weights for serving) must agree.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from clawrl.config import Config
from clawrl.train.group import FSDP_ON_CPU
from clawrl.train.saves import KEEP, ShardedSaves, is_complete, newest_save, parent_of, saves_dir
from clawrl.version_folder import MANIFEST, version_dir
from tests.conftest import CLAWRL, ROOT
from tests.service.test_train_group import add_batch, run_folder
from tests.timing import limit


def train(config: Config, steps: int) -> str:
    """`clawrl train --steps N` as a group of 2 ranks; its output."""
    cmd = [*CLAWRL, "train", "--run-dir", str(config.run_dir), "--steps", str(steps)]
    cmd += ["--train.distributed.num-processes", "2", "--train.threads", "2"]
    env = os.environ | {FSDP_ON_CPU: "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit(300), env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def state(config: Config, version: str, tmp_path) -> dict:
    """A sharded save read whole, without a process group (DCP's converter)."""
    out = tmp_path / f"{config.run_dir.name}-{version}.pt"
    dcp_to_torch_save(saves_dir(config.run_dir) / version, out)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_group_resumed_from_a_sharded_save_trains_the_step_it_would_have(
    tmp_path, tiny_model_dir, strategy
):
    """FSDP: each rank writes its shard; DDP: DCP splits the replicated tensors between the ranks."""
    runs = []
    for name in ("a", "b"):
        config = run_folder(tmp_path, name, tiny_model_dir, "full", strategy=strategy, canary=False)
        add_batch(config, 1)  # twelve samples: two steps of six
        runs.append(config)
    a, b = runs
    train(a, 2)
    train(b, 1)
    assert is_complete(saves_dir(b.run_dir) / "v1")
    v1 = version_dir(b.run_dir, "v1")
    assert not (v1 / "optimizer.pt").exists()  # the optimizer state is in the sharded save
    assert {t.dtype for t in load_file(v1 / "model.safetensors").values()} == {torch.bfloat16}
    train(b, 1)  # a new group: v1's weights and AdamW's moments from the save, then step 2

    sa, sb = state(a, "v2", tmp_path), state(b, "v2", tmp_path)
    assert sa["model"].keys() == sb["model"].keys() and sa["optim"]["state"].keys()
    for key, value in sa["model"].items():
        torch.testing.assert_close(
            sb["model"][key], value, rtol=1e-5, atol=1e-7, msg=lambda m, k=key: f"{k}: {m}"
        )
    for key, entry in sa["optim"]["state"].items():
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sb["optim"]["state"][key][moment], entry[moment], rtol=1e-5, atol=1e-9)
        assert float(sb["optim"]["state"][key]["step"]) == float(entry["step"]) == 2
    v1a = state(a, "v1", tmp_path)["model"]
    assert any(not torch.equal(v1a[k], v) for k, v in sa["model"].items())  # step 2 moved the weights
    wa, wb = (load_file(version_dir(c.run_dir, "v2") / "model.safetensors") for c in (a, b))
    for key, value in wa.items():  # bf16 of (nearly) equal float32: at most one rounding step apart
        torch.testing.assert_close(wb[key].float(), value.float(), rtol=8e-3, atol=1e-6)


def manifests(run_dir, parents: dict[str, str], rollback: dict[str, str] | None = None) -> None:
    for name, parent in parents.items():
        folder = version_dir(run_dir, name)
        folder.mkdir(parents=True)
        extra = {"rollback_of": rollback[name]} if rollback and name in rollback else {}
        (folder / MANIFEST).write_text(json.dumps({"version": name, "parent": parent, **extra}))


def test_a_save_cut_short_falls_back_to_the_previous_complete_one(tmp_path):
    manifests(tmp_path, {"v1": "v0", "v2": "v1", "v3": "v2", "v4": "v2"}, rollback={"v4": "v2"})
    root = saves_dir(tmp_path)
    for name in ("v1", "v2", "v3"):
        (root / name).mkdir(parents=True)
        (root / name / "__0_0.distcp").write_bytes(b"shard")
    (root / "v1" / ".metadata").write_bytes(b"done")
    parent = parent_of(tmp_path)
    assert newest_save(root, "v3", parent) == ("v1", False)  # v3 and v2: no metadata, cut short
    (root / "v2" / ".metadata").write_bytes(b"done")
    assert newest_save(root, "v3", parent) == ("v2", False)  # AdamW's moments only: v3's weights
    assert newest_save(root, "v2", parent) == ("v2", True)
    assert newest_save(root, "v4", parent) == ("v2", True)  # a rollback to v2 is v2's state
    assert newest_save(tmp_path / "none", "v3", parent) is None


def test_old_saves_are_pruned_to_the_newest_complete_ones(tmp_path):
    root = saves_dir(tmp_path)
    for n in range(1, 6):
        (root / f"v{n}").mkdir(parents=True)
        if n != 2 and n != 5:
            (root / f"v{n}" / ".metadata").write_bytes(b"done")
    saves = ShardedSaves.__new__(ShardedSaves)  # pruning alone: no process group
    saves.root = root
    saves.prune()
    # v3, v4 kept (KEEP complete ones); v5 is being written; v1 and the cut-short v2 go
    assert sorted(p.name for p in root.iterdir()) == ["v3", "v4", "v5"] and KEEP == 2


def test_save_every_below_one_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="train.distributed.save_every"):
        Config(train={"distributed": {"save_every": 0}})
