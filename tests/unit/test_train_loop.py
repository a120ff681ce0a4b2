"""The trainer loop on a real store and a tiny model: batches, versions, resume, rollback, export, and
memory's retirement probe after a publish."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.cli import main
from clawrl.config import Config
from clawrl.engine.local.merge import full_weights_loader
from clawrl.store.db import Store
from clawrl.testing import make_turn
from clawrl.train.checkpoints import copy_version
from clawrl.train.group import RankGroup
from clawrl.train.loop import TrainLoop
from clawrl.train.policy import build_policy
from clawrl.train.publish import export, rollback
from clawrl.types import HELD, PASSED, UNCHECKED, Judgment, Sample, Version
from clawrl.wiring.trainer import memory_probe

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    """A run folder whose store holds one session of 40 main turns, and the config to train it."""
    config = Config(
        run_dir=tmp_path / "run",
        model={"path": str(tiny_model_dir)},
        train={"batch_size": 4, "lr": 1e-2, "poll_s": 0.01, "lora": {"rank": 4, "alpha": 8}},
    )
    config.run_dir.mkdir()
    config.write()  # as `clawrl serve` does: `train`, `rollback` and `export` read it
    with Store.open(config.run_dir / "clawrl.db") as store:
        store.upsert_session("s1", "header", 1.0)
        for i in range(40):
            store.insert_turn(make_turn(f"t{i}", "s1", i, created_at=10.0 + i))
        yield config, store


def add(store: Store, n: int, start: int = 0, **kw) -> list[int]:
    samples = []
    for i in range(start, start + n):
        response = [4093 + i, 30, 2][: 1 + i % 3]
        values = dict(
            turn_id=f"t{i}",
            kind="rl",
            prompt_ids=PROMPT[: 6 + i % 7],
            response_ids=response,
            logprobs=[-3.0] * len(response),
            version="v0",
            temperature=1.0,
            reward=1.0 if i % 2 else -1.0,
        )
        samples.append(Sample(**{**values, **kw}))
    return store.insert_samples(samples)


def loop_for(config: Config, store: Store) -> TrainLoop:
    loop = TrainLoop(store, build_policy(config.model.path, config.train, "cpu"), config.run_dir)
    loop.resume()
    return loop


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def lora_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def test_waits_for_a_full_batch_then_publishes_a_version(run, capsys, caplog):
    config, store = run
    loop = loop_for(config, store)
    first = add(store, 3)
    assert loop.run_once() is False and store.latest_version().name == "v0"
    first += add(store, 1, start=3)
    with caplog.at_level(logging.INFO, logger="clawrl.trainer"):
        assert loop.run_once() is True
    v1 = store.latest_version()
    assert (v1.name, v1.step, v1.parent) == ("v1", 1, "v0")
    for key in ("loss", "pg_loss", "kl", "mean_reward", "tokens", "step_s", "tokens_per_s", "mismatch_exact"):
        assert math.isfinite(v1.metrics[key]), key
    # The progress line: the importance weights, the mismatch and its numerics share, both rates;
    # no clip fraction (0 in every step: the ratio is to the step's own forward).
    m = v1.metrics
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("published v1"))
    assert (
        f"IS weight {m['is_weight_mean']:.3f} (min {m['is_weight_min']:.3f}, "
        f"{100 * m['is_truncated_frac']:.1f}% truncated), mismatch {m['mismatch']:.4f} "
        f"(exact {m['mismatch_exact']:.4f}), {m['tokens']} answer tokens in {m['step_s']:.2f} s "
        f"({m['tokens_per_s']:.0f} answer tokens/s, {m['processed_tokens_per_s']:.0f} processed tokens/s)"
    ) in line
    assert "clip" not in line and m["processed_tokens_per_s"] > m["tokens_per_s"]
    assert v1.metrics["samples"] == 4 and v1.metrics["samples_rl"] == 4
    folder = config.run_dir / "checkpoints" / "v1"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["samples"] == first and manifest["step"] == 1
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= {
        p.name for p in folder.iterdir()
    }
    assert [store.sample_status(i)[0] for i in first] == ["trained"] * 4
    assert loop.run_once() is False  # nothing is trained twice
    assert main(["versions", "--run-dir", str(config.run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["v0", "v1"]
    assert "samples 4" in lines[1] and "loss=" in lines[1]


def test_defective_and_stale_samples_are_left_out_with_their_reason(run):
    config, store = run
    config.train.max_staleness = 0
    loop = loop_for(config, store)
    add(store, 4)
    assert loop.run_once()
    (nan,) = add(store, 1, start=4, logprobs=[float("nan")], response_ids=[5])
    (empty,) = add(store, 1, start=5, response_ids=[], logprobs=[])
    (long,) = add(store, 1, start=6, prompt_ids=list(range(5000)))
    (stale,) = add(store, 1, start=7, version="v0")
    (alien,) = add(store, 1, start=8, response_ids=[10**6], logprobs=[-1.0])
    assert loop.run_once() is False
    assert store.sample_status(nan) == ("skipped", "bad logprobs: non-finite behaviour logprobs")
    assert store.sample_status(empty) == ("skipped", "empty response: no token to train")
    # No train.max_seq_len set: the window is the served one (the tiny model's 512 tokens).
    assert store.sample_status(long) == (
        "skipped",
        "too long: 5001 tokens > the training window 512 (train.max_seq_len)",
    )
    assert store.sample_status(stale) == ("stale", "made by v0, 1 training steps behind v1")
    assert store.sample_status(alien)[1].startswith("unknown tokens: ids outside the model's vocabulary")
    counters = store.counters()  # what /healthz, /metrics and the dashboard show, by reason
    assert {k: n for k, n in counters.items() if k.startswith("skipped:")} == {
        "skipped:bad logprobs": 1,
        "skipped:empty response": 1,
        "skipped:too long": 1,
        "skipped:unknown tokens": 1,
    }


def test_held_versions_do_not_age_the_waiting_samples(run):
    """Two canary holds (v2, v3): the trainer goes back to v1 each time and trains v4 from it. A
    sample made by v1 is then one step behind v4 along its lineage, not three version numbers, and
    is trained, not marked stale (train/lineage.py)."""
    config, store = run
    verdicts = iter([PASSED, HELD, HELD, PASSED, PASSED])
    loop = TrainLoop(
        store,
        build_policy(config.model.path, config.train, "cpu"),
        config.run_dir,
        canary=lambda policy: (next(verdicts), None),
    )
    loop.resume()
    add(store, 4)
    assert loop.run_once() and store.latest_version().name == "v1"
    waiting = add(store, 16, start=4, version="v1")
    for _ in range(4):  # v2 held, v3 held, v4 passed (from v1), v5 passed
        assert loop.run_once()
    names = [(v.name, v.parent, v.step, v.status) for v in store.versions()]
    assert names[1:] == [
        ("v1", "v0", 1, PASSED),
        ("v2", "v1", 2, HELD),
        ("v3", "v1", 2, HELD),
        ("v4", "v1", 2, PASSED),
        ("v5", "v4", 3, PASSED),
    ]
    # v5 trained the last four of v1's samples from v4: one step behind it, within max_staleness 2.
    assert [store.sample_status(i)[0] for i in waiting] == ["trained"] * 16
    assert store.count_samples("stale") == 0


class PoisonedTrainer:
    """The real trainer, whose step raises when its batch holds the poison turn, as a step that a
    bad sample breaks does (the loop's seam: it calls `policy.trainer.step`); it records each step."""

    def __init__(self, trainer, poison: str) -> None:
        self.trainer, self.poison, self.steps = trainer, poison, []

    def step(self, samples, split=False, current=None):
        self.steps.append([s.turn_id for s in samples])
        if any(s.turn_id == self.poison for s in samples):
            raise ValueError(f"{self.poison} breaks the step")
        return self.trainer.step(samples, split=split, current=current)

    def __getattr__(self, name):
        return getattr(self.trainer, name)


def poisoned_loop(config: Config, store: Store, poison: str) -> TrainLoop:
    """A trainer process (a new one at each call: a restart) whose steps `poison` breaks."""
    policy = build_policy(config.model.path, config.train, "cpu")
    policy.trainer = PoisonedTrainer(policy.trainer, poison)
    loop = TrainLoop(store, policy, config.run_dir)
    loop.resume()
    return loop


def test_a_poison_sample_is_skipped_at_its_second_failed_step_and_learning_goes_on(run, capsys):
    """Before: the step failed, the claims went back, the restarted trainer picked the same batch,
    forever. Now each failed step counts against its samples in the store (across restarts); a
    batch holds at most one sample that failed before; the poison is skipped at its second failure
    with the exception as its reason, and the samples that shared its batch are trained."""
    from clawrl.api.metrics import Metrics
    from clawrl.api.state import Served, Snapshot, Stored, TrainerState, _counts
    from clawrl.engine.base import EngineStats

    config, store = run
    config.train.batch_size = 2
    first = add(store, 2)  # t0 and the poison, t1
    loop = poisoned_loop(config, store, "t1")
    with pytest.raises(ValueError, match="t1 breaks the step"):
        loop.run_once()
    assert [store.sample_status(i)[0] for i in first] == ["ready"] * 2
    fresh = add(store, 4, start=2)  # t2..t5
    with Store.open(config.run_dir / "clawrl.db") as reopened:  # the restarted trainer's own store
        assert [s.attempts for s in reopened.ready_samples()] == [1, 1, 0, 0, 0, 0]
        loop = poisoned_loop(config, reopened, "t1")
        assert loop.run_once()  # t0 beside an untried sample: v1
        with pytest.raises(ValueError):  # t1 beside an untried one: its second failure
            loop.run_once()
        assert loop.policy.trainer.steps == [["t0", "t2"], ["t1", "t3"]]
    assert store.sample_status(first[1]) == ("skipped", "failed step: ValueError: t1 breaks the step")
    loop = poisoned_loop(config, store, "t1")  # restarted again: t3 failed once, beside t4
    assert loop.run_once() and loop.run_once() is False  # t5 waits for an untried companion
    add(store, 1, start=6)
    assert loop.run_once()
    assert loop.policy.trainer.steps == [["t3", "t4"], ["t5", "t6"]]
    assert store.latest_version().name == "v3"
    assert [store.sample_status(i)[0] for i in [first[0], *fresh]] == ["trained"] * 5
    assert store.count_samples("trained") == 6 and store.count_samples("ready") == 0
    # Seen by a person: records show (the reason and the count), the dashboard's counts, /metrics.
    assert main(["records", "show", "--session", "s1", "--run-dir", str(config.run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"sample {first[1]} (rl, made by v0): skipped: failed step: ValueError: t1 breaks the step" in out
    assert "(2 failed steps)" in out and f"sample {fresh[1]} (rl, made by v0): trained (1 failed step)" in out
    counts = _counts(store.counters(), None)
    assert counts.skipped == {"failed step": 1}
    stored = Stored(counts, [], 3, {}, [], [])
    snap = Snapshot(
        0.0, "m", "combine", Served("v3"), EngineStats(), 1, None, TrainerState(None, 2, None), stored
    )
    text = asyncio.run(Metrics(FixedState(snap)).scrape()).decode()
    assert 'clawrl_samples_skipped_total{reason="failed step"} 1.0' in text


class FixedState:
    """Implements the one method `Metrics` calls: `snapshot()`."""

    def __init__(self, snapshot):
        self._snapshot = snapshot

    async def snapshot(self):
        return self._snapshot

    def swapped(self, version, seconds):
        pass


class ShortOfMemory:
    """The real trainer on a GPU too small for a whole micro-batch: a step raises
    torch.OutOfMemoryError unless split (`fails` times: every step, also split, when None)."""

    def __init__(self, trainer, fails: int | None = 1) -> None:
        self.trainer, self.fails, self.calls = trainer, fails, []

    def step(self, samples, split=False, current=None):
        self.calls.append(split)
        if self.fails is None or (not split and self.fails):
            if self.fails:
                self.fails -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.trainer.step(samples, split=split, current=current)

    def __getattr__(self, name):
        return getattr(self.trainer, name)


def test_an_out_of_memory_step_is_retried_once_split_before_it_counts(run):
    config, store = run
    policy = build_policy(config.model.path, config.train, "cpu")
    policy.trainer = short = ShortOfMemory(policy.trainer)
    loop = TrainLoop(store, policy, config.run_dir)
    loop.resume()
    ids = add(store, 4)
    assert loop.run_once()  # out of memory, then split in halves and unpacked: trained
    assert short.calls == [False, True]
    assert [store.sample_status(i)[0] for i in ids] == ["trained"] * 4
    assert [s.attempts for s in store.ready_samples()] == []
    short.fails, short.calls = None, []  # the split retry runs out of memory too: a failure
    more = add(store, 4, start=4)
    with pytest.raises(torch.OutOfMemoryError):
        loop.run_once()
    assert short.calls == [False, True]
    assert [s.attempts for s in store.ready_samples()] == [1] * 4
    assert [store.sample_status(i)[0] for i in more] == ["ready"] * 4


def test_a_trainer_whose_every_sample_is_skipped_says_so_as_an_error(run, caplog):
    """A new user's agent prompts all past the window: nothing trains, and the trainer, /healthz
    (`Counts.samples_error`) and the dashboard say why instead of waiting in silence."""
    from clawrl.api.state import _counts

    config, store = run
    loop = loop_for(config, store)
    add(store, 4, prompt_ids=list(range(600)))  # past the tiny model's 512-token window
    with caplog.at_level(logging.ERROR, logger="clawrl.trainer"):
        assert loop.run_once() is False
    assert "every sample so far was skipped (the last: too long: 601 tokens" in caplog.text
    error = _counts(store.counters(), None).samples_error()
    assert error == "every sample so far was skipped (4 too long): the trainer has nothing to train on"
    add(store, 4, start=4)  # samples that fit: trained, and the error is gone
    assert loop.run_once()
    assert _counts(store.counters(), None).samples_error() is None


def judged(store: Store, n: int, score: int = 1) -> list[int]:
    """Samples of turns t0..t(n-1), each written with a judgment of its turn, as the judge writes them."""
    ids = []
    for i in range(n):
        (made,) = [Sample(f"t{i}", "rl", PROMPT, [4093 + i, 2], [-3.0, -3.0], "v0", 1.0, reward=float(score))]
        store.insert_judgment(Judgment(f"t{i}", "prm", [], score, None, 30.0 + i), [made])
        ids.append(made.id)
    return ids


def test_a_rating_judgment_or_staleness_mark_during_the_step_leaves_the_trained_samples_trained(run):
    """The race a loaded CI machine once hit: a rating superseded a sample the trainer held, and the
    version counted a sample whose status was `superseded`. Here it lands during the step on purpose
    (from the canary, which runs between the step and the publish)."""
    config, store = run
    held = judged(store, 4, score=-1)
    late: list[int] = []

    def check(policy):
        assert [store.sample_status(i)[0] for i in held] == ["training"] * 4  # claimed before the step
        rating = Sample("t0", "rl", PROMPT, [4093, 2], [-3.0, -3.0], "v0", 1.0, reward=1.0)
        store.insert_judgment(Judgment("t0", "feedback", [], 1, None, 50.0), [rating])  # a rating
        store.insert_judgment(Judgment("t1", "prm", [], 1, None, 51.0))  # a new judgment, no sample
        store.leave_out_samples({held[2]: "a staleness mark"}, "stale")  # a staleness mark
        late.append(rating.id)
        return UNCHECKED, None

    loop = TrainLoop(
        store, build_policy(config.model.path, config.train, "cpu"), config.run_dir, canary=check
    )
    loop.resume()
    assert loop.run_once()
    v1 = store.latest_version()
    assert v1.metrics["samples"] == 4 == store.count_samples("trained")
    assert [store.sample_status(i)[0] for i in held] == ["trained"] * 4
    assert store.sample_status(late[0]) == (
        "skipped",
        "its turn was trained on (this kind) by v1, from an earlier judgment",
    )
    assert store.count_samples("ready") == 0 and store.count_samples("training") == 0


def test_a_dropped_or_failed_step_hands_its_samples_back(run):
    config, store = run
    held = judged(store, 4)
    calls = []

    def check(policy):
        calls.append(1)
        if len(calls) == 1:  # a rating of t3 lands, then a rollback is published: the step is dropped
            store.insert_judgment(Judgment("t3", "feedback", [], -1, None, 60.0), [])
            rollback(store, config, "v0")
            return UNCHECKED, None
        raise RuntimeError("the canary's engine died")

    loop = TrainLoop(
        store, build_policy(config.model.path, config.train, "cpu"), config.run_dir, canary=check
    )
    loop.resume()
    assert loop.run_once() is False and store.latest_version().name == "v1"  # the rollback, not a step
    assert [store.sample_status(i)[0] for i in held] == ["ready"] * 3 + ["superseded"]
    add(store, 1, start=4)
    with pytest.raises(RuntimeError, match="died"):
        loop.run_once()
    assert store.count_samples("training") == 0 and store.count_samples("ready") == 4


def test_a_starting_trainer_hands_back_what_a_dead_one_claimed(run):
    config, store = run
    held = judged(store, 4)
    assert store.claim_samples(held) == held  # a trainer claimed them, then died mid-step
    store.insert_judgment(Judgment("t2", "feedback", [], -1, None, 60.0), [])
    loop = loop_for(config, store)
    assert [store.sample_status(i)[0] for i in held] == ["ready", "ready", "superseded", "ready"]
    add(store, 1, start=4)
    assert loop.run_once() and store.count_samples("trained") == 4


def test_a_backlog_trains_oldest_first_and_the_newer_samples_after(run):
    config, store = run
    loop = loop_for(config, store)
    older, newer = add(store, 4), add(store, 4, start=4)
    manifest = config.run_dir / "checkpoints" / "{}" / "manifest.json"
    assert loop.run_once()
    assert json.loads(Path(str(manifest).format("v1")).read_text())["samples"] == older
    assert loop.run_once()
    assert json.loads(Path(str(manifest).format("v2")).read_text())["samples"] == newer
    assert store.count_samples("trained") == 8 and store.count_samples("stale") == 0


def test_a_new_trainer_resumes_from_the_last_version_with_its_optimizer(run):
    config, store = run
    loop = loop_for(config, store)
    add(store, 4)
    assert loop.run_once()
    orphan = config.run_dir / "checkpoints" / "v2"  # as if a trainer died between folder and row
    orphan.mkdir()
    (orphan / "manifest.json").write_text("{}")
    again = loop_for(config, store)
    assert again.version == "v1" and again.step == 1
    assert not orphan.exists() and list((config.run_dir / "checkpoints").glob(".v2-unpublished-*"))
    mine, theirs = lora_state(loop.policy.model), lora_state(again.policy.model)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    a, b = loop.policy.optimizer.state_dict()["state"], again.policy.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)
    add(store, 4, start=4)
    assert again.run_once() and store.latest_version().name == "v2"


def test_a_rollback_is_served_and_trained_from(run, capsys):
    config, store = run
    loop = loop_for(config, store)
    add(store, 4)
    assert loop.run_once()
    v1 = lora_state(loop.policy.model)
    add(store, 4, start=4)
    assert loop.run_once()
    assert main(["rollback", "v1", "--run-dir", str(config.run_dir)]) == 0
    assert "published v3" in capsys.readouterr().out
    v3 = store.latest_version()
    assert (v3.parent, v3.metrics["rollback_of"], v3.step) == ("v1", "v1", 1)
    loop.run_once()  # no samples: it only follows the rollback
    assert loop.version == "v3" and loop.step == 1
    now = lora_state(loop.policy.model)
    assert all(torch.equal(now[k], v1[k]) for k in v1)
    rollback(store, config, "v0")
    loop.run_once()
    assert loop.version == "v4"
    assert all(not p.any() for k, p in lora_state(loop.policy.model).items() if "lora_B" in k)
    assert main(["rollback", "v9", "--run-dir", str(config.run_dir)]) == 2
    assert "no version v9" in capsys.readouterr().err


def test_export_writes_the_version_as_a_plain_model(run, tmp_path):
    config, store = run
    loop = loop_for(config, store)
    add(store, 4)
    assert loop.run_once()
    out = tmp_path / "merged"
    assert main(["export", "--merged", str(out), "--run-dir", str(config.run_dir)]) == 0
    plain = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = loop.policy.model(input_ids=ids).logits
        assert torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(config.model.path)(input_ids=ids).logits
    assert not torch.allclose(base, expected, atol=1e-4)  # the export is the trained version, not the base
    assert (out / "tokenizer_config.json").is_file()
    with pytest.raises(FileExistsError):
        export(store, config, None, out)
    assert (
        main(
            ["export", "--merged", str(tmp_path / "v7"), "--version", "v7", "--run-dir", str(config.run_dir)]
        )
        == 2
    )


def test_full_fine_tuning_versions_load_in_a_server_model(run):
    config, store = run
    config.train.weights = "full"
    config.train.lr = 1e-3
    loop = loop_for(config, store)
    assert loop.policy.trainer.frozen is not None  # kl_coef > 0 needs the frozen reference
    add(store, 4)
    assert loop.run_once()
    folder = config.run_dir / "checkpoints" / "v1"
    served = AutoModelForCausalLM.from_pretrained(config.model.path)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        full_weights_loader(folder)(served)
        assert torch.allclose(
            served(input_ids=ids).logits, loop.policy.model(input_ids=ids).logits, atol=1e-5
        )
    again = loop_for(config, store)
    assert same_weights(again.policy.model, loop.policy.model)
    rollback(store, config, "v0")  # full weights: v0 comes back as a copy of the base weights
    again.run_once()
    base = AutoModelForCausalLM.from_pretrained(config.model.path)
    assert same_weights(again.policy.model, base)
    assert (config.run_dir / "checkpoints" / "v2" / "model.safetensors").is_file()


def test_a_broken_version_is_passed_over_and_training_goes_on(run, caplog):
    config, store = run
    loop = loop_for(config, store)
    add(store, 4)
    assert loop.run_once()
    v1 = config.run_dir / "checkpoints" / "v1"
    broken = copy_version(config.run_dir, "v2", [p for p in v1.iterdir() if p.name != "manifest.json"], {})
    weights = broken / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short, as a crash mid-copy leaves it
    store.publish_version(Version("v2", 2, str(broken), {"samples": 0}, "v1"), trained=[])

    assert loop.run_once() is False and loop.version == "v1"  # the running trainer stays on v1
    again = loop_for(config, store)  # so does a restarted one, instead of crashing in a loop
    assert again.version == "v1"
    assert "cannot train from v2" in caplog.text and "not a readable safetensors file" in caplog.text
    add(store, 4, start=4)
    assert again.run_once()
    v3 = store.latest_version()
    assert (v3.name, v3.parent) == ("v3", "v1")


def test_each_step_is_logged_to_metrics_jsonl_and_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from clawrl.train.loggers import StepLoggers

    config, store = run
    policy = build_policy(config.model.path, config.train, "cpu")
    loop = TrainLoop(
        store, policy, config.run_dir, loggers=StepLoggers(["jsonl", "tensorboard"], config.run_dir)
    )
    loop.resume()
    add(store, 8)
    assert loop.run_once() and loop.run_once()
    loop.loggers.close()
    lines = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = store.versions()[1:]
    assert [(x["version"], x["step"], x["parent"]) for x in lines] == [("v1", 1, "v0"), ("v2", 2, "v1")]
    assert [x["loss"] for x in lines] == [v.metrics["loss"] for v in versions]
    assert all(x["samples"] == 4 and x["tokens_per_s"] > 0 for x in lines)
    events = EventAccumulator(str(config.run_dir / "tensorboard"))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2]
    assert [e.value for e in loss] == pytest.approx([v.metrics["loss"] for v in versions], rel=1e-6)
    assert {"train/kl", "train/mismatch_exact", "train/tokens_per_s"} <= set(events.Tags()["scalars"])


def test_jsonl_is_the_default_logger_and_a_restart_appends(run):
    config, store = run
    assert config.train.loggers == ["jsonl"]
    from clawrl.train.loggers import StepLoggers

    for _ in range(2):  # two trainer lives on one run folder
        loop = TrainLoop(
            store,
            build_policy(config.model.path, config.train, "cpu"),
            config.run_dir,
            loggers=StepLoggers(config.train.loggers, config.run_dir),
        )
        loop.resume()
        add(store, 4, start=4 * store.latest_version().step)
        assert loop.run_once()
        loop.loggers.close()
    steps = [json.loads(line)["step"] for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not (config.run_dir / "tensorboard").exists()


def test_the_memory_retirement_probe_runs_every_probe_every_steps_with_memory_on(run):
    """The trainer process's probe (clawrl/train/memory_probe.py) runs after the publish of every
    `memory.probe_every`-th step: with thresholds no gap can stay under, the experience is distilled
    and no longer offered."""
    config, store = run
    config.memory.enabled = True
    config.memory.probe_every = 2
    config.memory.active_above = 1e9  # validated on assignment: the upper one first
    config.memory.distilled_below = 1e9
    wish = store.learn("Keep answers short and to the point.", "t0", "s1", now=1.0)
    policy = build_policy(config.model.path, config.train, "cpu")
    probe = memory_probe(config, store, policy.model, Path(config.model.path), RankGroup())
    loop = TrainLoop(store, policy, config.run_dir, after_publish=probe)
    loop.resume()
    add(store, 8)
    assert loop.run_once() is True  # v1 (step 1): not probed
    assert store.experience(wish.id).probed_at is None
    assert loop.run_once() is True  # v2 (step 2): probed
    probed = store.experience(wish.id)
    assert probed.state == "distilled" and probed.gap > 0 and probed.probed_at is not None
    assert store.recall_candidates("short answers") == []
    config.memory.probe = False
    assert memory_probe(config, store, policy.model, Path(config.model.path), RankGroup()) is None


def test_no_memory_probe_while_memory_is_off(run):
    """memory.enabled false (the default) with memory.probe true: nothing is injected, so no
    experience is retired and the trainer builds no probe."""
    config, store = run
    assert config.memory.enabled is False and config.memory.probe is True
    policy = build_policy(config.model.path, config.train, "cpu")
    assert memory_probe(config, store, policy.model, Path(config.model.path), RankGroup()) is None


def test_probe_every_under_one_is_refused_at_start_naming_the_field(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["train", "--run-dir", str(tmp_path / "r"), "--memory.probe_every", "0"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "memory.probe_every" in err and "greater than or equal to 1" in err
    assert not (tmp_path / "r").exists()


def test_only_the_samples_of_the_users_in_the_file_are_trained(run):
    """With users (docs/users.md) the trainer takes the samples of the users it is given: a user
    removed from the users file (carol) is not trained on, and her samples stay ready in the store."""
    config, store = run
    store.upsert_session("s2", "header", 1.0, "carol")
    for i in range(4):
        store.insert_turn(make_turn(f"c{i}", "s2", i, created_at=60.0 + i))
    carols = store.insert_samples(
        [Sample(f"c{i}", "rl", PROMPT[:8], [4093, 30], [-3.0, -3.0], "v0", 1.0, reward=1.0) for i in range(4)]
    )
    policy = build_policy(config.model.path, config.train, "cpu")
    loop = TrainLoop(store, policy, config.run_dir, users=frozenset({"default", "alice"}))
    loop.resume()
    assert loop.run_once() is False  # four ready samples, none of them a trained user's
    mine = add(store, 4)
    assert loop.run_once() is True
    assert [store.sample_status(i)[0] for i in mine] == ["trained"] * 4
    assert [store.sample_status(i)[0] for i in carols] == ["ready"] * 4
