"""Pruning version folders (`train.keep_versions`): the pure choice, then real folders written by the
trainer (a tiny model, full weights and LoRA), their export and rollback, and what always survives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
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
from clawrl.version_folder import folder_bytes, pruned_files, pruned_marker, weights_pruned

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


def test_lora_adapters_are_pruned_like_full_weights_and_every_nth_kept_in_bf16():
    chosen = choose(versions(*"pppppp"), served={"v2"}, keep=2, full=False)
    assert chosen == Pruning(optimizer=("v1", "v3", "v4"), weights=("v1", "v3", "v4"))
    nth = choose(versions(*"pppppp"), served={"v2"}, keep=2, full=False, every=2)
    # v4: a multiple of 2, its adapter kept (in bf16, its optimizer state gone); v2 served, whole
    assert nth == Pruning(optimizer=("v1", "v3", "v4"), weights=("v1", "v3"), halve=("v4",))
    assert nth.why["v4"] == "optimizer state: not among the newest 2 (train.keep_versions) nor served"
    assert nth.why["v1"] == (
        "weights and optimizer state: not among the newest 2 (train.keep_versions), not served, "
        "held last nor rolled back to, not a multiple of 2 (train.keep_every)"
    )
    # full weights: every N-th kept too, never cast
    assert choose(versions(*"pppppp"), served={"v2"}, keep=2, full=True, every=2).halve == ()


def test_a_held_version_is_kept_until_another_hold_replaces_it():
    rows = versions(*"phpppp")
    assert "v2" not in choose(rows, served={"v6"}, keep=2, full=False).weights  # the newest held
    rows = versions(*"phphpp")
    assert choose(rows, served={"v6"}, keep=2, full=False).weights == ("v1", "v2", "v3")  # v4 replaced v2


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
    with pytest.raises(ValidationError, match="train.keep_every"):
        load_config(None, parse_overrides(["--train.keep-every", "-1"]))
    with pytest.raises(ValueError, match="train.keep_versions must be > 0"):
        choose(versions(*"p"), served=set(), keep=0, full=False)


def test_a_retention_under_one_is_refused_at_start_naming_the_field(tmp_path, capsys):
    for flag, value in (("--train.keep-versions", "0"), ("--train.keep-every", "-1")):
        with pytest.raises(SystemExit) as refused:
            main(["train", "--run-dir", str(tmp_path / "r"), flag, value])
        assert refused.value.code == 2
        err = capsys.readouterr().err
        assert flag.removeprefix("--").replace("-", "_") in err and "greater than" in err
    assert not (tmp_path / "r").exists()


def test_keep_every_defaults_to_a_sparse_history_of_adapters_and_none_of_whole_models():
    assert Config().train.keep_every == 20
    assert Config(train={"weights": "full"}).train.keep_every == 0


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


def test_lora_adapters_past_k_are_pruned_the_nth_kept_in_bf16_and_versions_says_why(run, tmp_path, capsys):
    config, store = run
    config.train.keep_every = 2
    loop = loop_for(config, store)
    train(loop, store, 3)
    adapter = {"README.md", "adapter_config.json", "adapter_model.safetensors", "manifest.json"}
    assert files(config, "v3") == adapter | {"optimizer.pt"}  # the newest: whole, in float32
    assert files(config, "v2") == adapter | {"pruned.json"}  # a multiple of 2: its adapter, in bf16
    assert files(config, "v1") == adapter - {"adapter_model.safetensors"} | {"pruned.json"}
    dtypes = {
        t.dtype
        for t in load_file(config.run_dir / "checkpoints" / "v2" / "adapter_model.safetensors").values()
    }
    assert dtypes == {torch.bfloat16}
    assert weights_pruned(config.run_dir / "checkpoints" / "v1")
    assert not weights_pruned(config.run_dir / "checkpoints" / "v2")

    assert main(["versions", "--run-dir", str(config.run_dir)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["v1"].endswith(
        " | pruned adapter_model.safetensors, optimizer.pt: weights and optimizer state: not among the "
        "newest 1 (train.keep_versions), not served, held last nor rolled back to, not a multiple of 2 "
        "(train.keep_every)"
    )
    assert lines["v2"].endswith(
        " | pruned optimizer.pt: optimizer state: not among the newest 1 (train.keep_versions) nor served"
        " | adapter in bf16"
    )
    assert "pruned" not in lines["v3"] and "bf16" not in lines["v3"]

    exported = export(store, config, "v2", tmp_path / "v2")  # a bf16 adapter exports
    assert (exported / "config.json").is_file()
    with pytest.raises(ValueError, match="the weights of v1 were pruned .*kept: v0, v2, v3"):
        export(store, config, "v1", tmp_path / "v1")

    again = loop_for(config, store)
    assert again.version == "v3"
    a, b = loop.policy.optimizer.state_dict()["state"], again.policy.optimizer.state_dict()["state"]
    assert a and a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)
    rollback(store, config, "v2")  # its optimizer state is gone: the trainer goes on with a fresh one
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


def test_a_bf16_adapter_serves_what_the_float32_one_did_within_the_stated_tolerance(tmp_path, tiny_model_dir):
    """The tolerance: every served log-probability within 0.05 nats of the float32 adapter's (0.031
    measured on the tiny model here; 0.020 on the embedded SmolLM2-135M at rank 16, whose adapter
    goes from 19.6 to 9.8 MB: bench/prune_disk.py), and the greedy token the same wherever its lead
    is over twice that."""
    from clawrl.engine.local.merge import MergedLora
    from clawrl.train.prune import prune
    from clawrl.train.weights import LoraSettings, attach_lora

    torch.manual_seed(0)
    trained = attach_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraSettings(4, 8))
    with torch.no_grad():  # an adapter that moves the output by more than a nat
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    for name in ("v1", "v2"):
        trained.save_pretrained(tmp_path / "checkpoints" / name)
    assert prune(tmp_path, Pruning(halve=("v2",))) > 0
    f32, b16 = (tmp_path / "checkpoints" / n / "adapter_model.safetensors" for n in ("v1", "v2"))
    assert b16.stat().st_size < 0.6 * f32.stat().st_size
    assert pruned_marker(b16.parent)["bf16"] == ["adapter_model.safetensors"]

    served = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    engine = MergedLora(served)  # how the local engine serves an adapter
    ids = torch.randint(0, 49000, (4, 64), generator=torch.Generator().manual_seed(0))
    logp = {}
    for name in ("v1", "v2", None):
        engine.apply(b16.parent) if name == "v2" else engine.apply(f32.parent) if name else engine.reset()
        with torch.no_grad():
            logp[name] = served(input_ids=ids).logits.float().log_softmax(-1)
    assert (logp["v1"] - logp[None]).abs().max() > 1.0  # the adapter matters
    assert (logp["v1"] - logp["v2"]).abs().max() < 0.05
    top2 = logp["v1"].topk(2).values
    clear = top2[..., 0] - top2[..., 1] > 0.1
    assert clear.sum() >= 4  # a random tiny model leads clearly at few positions
    assert torch.equal(logp["v1"].argmax(-1)[clear], logp["v2"].argmax(-1)[clear])


ADAPTER_BYTES = 64 * 1024  # each simulated adapter; its optimizer state twice that, as AdamW's is


@pytest.mark.parametrize("users", [("default",), ("alice", "bob")])
def test_a_200_version_lora_run_stays_under_its_stated_size(tmp_path, users):
    """200 publishes (with an adapter per user, 100 in each user's line), every 7th held, a rollback
    pinning an old version: the folder never passes, per line, (K + 1) whole versions + the newest
    held, the rolled-back-to and every N-th adapter in bf16, whatever the number of versions:

        bound = (K + 1) * 3S + (2 + n / N) * S / 2     S: an adapter's bytes, n: the line's versions

    With K = 2 and N = 20, 15 S for 200 versions, where keeping everything is 600 S: for a 4B model's
    132 MB float32 adapter (at rank 16) about 2.0 GB against 79 GB; for the embedded SmolLM2-135M's
    19.6 MB (measured, rank 16) 0.29 GB against 12 GB."""
    from safetensors.torch import save_file

    from clawrl.train.prune import prune
    from clawrl.version_folder import ADAPTER_WEIGHTS, MANIFEST, OPTIMIZER, version_dir, version_name

    keep, every, s = 2, 20, ADAPTER_BYTES
    lines: dict[str, list[Version]] = {u: [Version("v0", 0)] for u in users}
    peak = 0
    for k in range(200):
        user = users[k % len(users)]
        rows = lines[user]
        n = len(rows)
        name = version_name(user, n)
        folder = version_dir(tmp_path, name)
        folder.mkdir(parents=True)
        save_file({"base_model.model.x.lora_A.weight": torch.ones(s // 4)}, folder / ADAPTER_WEIGHTS)
        (folder / OPTIMIZER).write_bytes(bytes(2 * s))
        (folder / MANIFEST).write_text("{}")
        metrics = {"rollback_of": version_name(user, 38)} if n == 40 else {}  # v38: whole still
        rows.append(Version(name, n, str(folder), metrics, status=HELD if n % 7 == 0 else PASSED))
        served = next(v.name for v in reversed(rows) if not v.held)
        prune(tmp_path, choose(rows, served={served}, keep=keep, full=False, every=every))
        peak = max(peak, sum(folder_bytes(tmp_path).values()))
    per_line = 200 // len(users)
    bound = len(users) * ((keep + 1) * 3 * s + (2 + per_line / every) * s / 2)
    assert peak <= bound + 200 * 1024  # plus the small files: manifests, pruned.json, headers
    assert peak < 600 * s / 30
    sizes = folder_bytes(tmp_path)
    for user, rows in lines.items():
        kept = [v.name for v in rows[1:] if ADAPTER_WEIGHTS not in pruned_files(Path(v.path))]
        last = len(rows) - 1
        milestones = [version_name(user, n) for n in range(every, last + 1, every)]
        newest = [version_name(user, n) for n in (last - 1, last)]
        held = [v.name for v in rows if v.held][-1]
        assert set(kept) == {*milestones, *newest, held, version_name(user, 38)}, user
        assert all(sizes[n] > 3 * s for n in newest) and all(
            sizes[n] < s for n in milestones if n not in newest
        )


def test_each_users_line_is_pruned_on_its_own_keeping_what_that_user_was_served(run):
    """An adapter per user: alice's line is pruned after her publishes, bob's stays whole; alice's
    newest turn was answered by alice/v1, so it keeps its adapter though bob's turn is newer."""
    config, store = run
    config.train.keep_every = 0
    store.upsert_session("alice/s", "header", 1.0, user="alice")
    store.upsert_session("bob/s", "header", 1.0, user="bob")
    store.insert_turn(make_turn("a-served", "alice/s", 0, created_at=200.0, versions=["alice/v1"]))
    store.insert_turn(make_turn("b-served", "bob/s", 0, created_at=300.0, versions=["v0"]))
    loop = TrainLoop(
        store,
        build_policy(config.model.path, config.train, "cpu"),
        config.run_dir,
        users=frozenset({"alice", "bob"}),
        per_user=True,
    )
    loop.resume()
    for user, steps in (("bob", 1), ("alice", 3)):
        for k in range(steps):
            for i in range(4):  # a sample is its turn's session's user's
                store.insert_turn(make_turn(f"{user}{k}-{i}", f"{user}/s", 1 + 4 * k + i, created_at=50.0))
            store.insert_samples(
                [
                    Sample(
                        f"{user}{k}-{i}", "rl", PROMPT[: 6 + i], [4093 + i, 2], [-3.0, -3.0], "v0", 1.0, 1.0
                    )
                    for i in range(4)
                ]
            )
            assert loop.run_once() and loop.user == user
    weights = {
        name: "adapter_model.safetensors" in files(config, name)
        for name in ("alice/v1", "alice/v2", "alice/v3", "bob/v1")
    }
    assert weights == {"alice/v1": True, "alice/v2": False, "alice/v3": True, "bob/v1": True}
