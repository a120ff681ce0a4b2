"""The canary gate's parts: the verdict, the general set, the measures, and the gate in the trainer loop."""

from __future__ import annotations

import json
import math
from contextlib import nullcontext

import pytest
import torch

from clawrl.chat.template import ChatRenderer
from clawrl.config import Config, GuardConfig
from clawrl.guard.gate import Canary
from clawrl.guard.general import encode, is_right, load_items
from clawrl.guard.measure import (
    ANSWER_TOKENS,
    answer_scores,
    as_answers,
    canary_score,
    forward_kl,
    greedy_answers,
    reference_logprobs,
)
from clawrl.guard.replay import Replay
from clawrl.guard.verdict import decide
from clawrl.store.db import Store
from clawrl.train.loop import TrainLoop
from clawrl.train.policy import build_policy
from clawrl.types import HELD, PASSED
from tests.unit.test_train_loop import add, run  # noqa: F401 -- `run` is a fixture

# --- the verdict: pure arithmetic -------------------------------------------------------------


def test_a_version_within_both_limits_passes_and_a_better_one_has_a_negative_drop():
    v = decide(base=0.5, score=0.49, kl=0.01, max_drop=0.05, max_kl=0.25)
    assert v.status == PASSED and v.reason is None and v.drop == pytest.approx(0.02)
    assert decide(0.5, 0.6, None, 0.05, 0.25).drop == pytest.approx(-0.2)


def test_a_drop_past_max_drop_or_a_kl_past_max_kl_holds_the_version_and_says_why():
    dropped = decide(0.5, 0.45, 0.01, 0.05, 0.25)
    assert dropped.status == HELD and "10.0% below" in dropped.reason and "KL" not in dropped.reason
    drifted = decide(0.5, 0.5, 0.3, 0.05, 0.25)
    assert drifted.status == HELD and drifted.reason == "KL(base || version) 0.3000 nats/token > 0.25"
    both = decide(0.5, 0.4, 0.3, 0.05, 0.25)
    assert both.reason.count(";") == 1


def test_fewer_right_answers_than_max_accuracy_drop_allows_hold_the_version():
    kept = decide(0.5, 0.5, 0.01, 0.05, 0.25, accuracy=(0.5, 0.45), max_accuracy_drop=0.2)
    assert kept.status == PASSED and kept.accuracy_drop == pytest.approx(0.1)
    lost = decide(0.5, 0.6, 0.01, 0.05, 0.25, accuracy=(0.5, 0.25), max_accuracy_drop=0.2)
    assert lost.status == HELD and lost.reason == "right answers 25.0% are 50.0% below the base's 50.0%"
    assert decide(0.5, 0.5, None, 0.05, 0.25, accuracy=(0.0, 0.0)).accuracy_drop is None


def test_a_right_answer_contains_a_key_word_whole():
    assert is_right("The capital of France is Paris.", "Paris")
    assert is_right("there are 2,000 metres", "2,000|2000") and is_right("Seven days.", "seven|7")
    assert not is_right("It is 10 degrees.", "0") and not is_right("Parisian food", "Paris")


def test_a_base_score_of_zero_is_an_error_not_a_verdict():
    with pytest.raises(ValueError, match="must be positive"):
        decide(0.0, 0.1, None, 0.05, 0.25)


# --- the general set ---------------------------------------------------------------------------


def test_the_general_set_has_disjoint_canary_and_replay_halves():
    canary, replay = load_items("canary"), load_items("replay")
    assert len(canary) >= 24 and len(replay) >= 8
    assert not {i.prompt for i in canary} & {i.prompt for i in replay}
    assert len({i.id for i in canary + replay}) == len(canary) + len(replay)
    for item in canary + replay:  # every reference contains one of its key words
        assert any(k.lower() in item.reference.lower() for k in item.key.split("|")), item.id
    with pytest.raises(ValueError, match="known: canary, replay"):
        load_items("train")


def test_an_item_is_encoded_as_the_server_renders_a_request_and_its_answer_ends_the_turn(smol_tokenizer):
    item = load_items("canary")[0]
    encoded = encode([item], smol_tokenizer)[0]
    rendered = ChatRenderer(smol_tokenizer).render([{"role": "user", "content": item.prompt}])
    assert encoded.prompt_ids == rendered.prompt_ids
    assert encoded.reference_ids[-1] == smol_tokenizer.eos_token_id
    assert smol_tokenizer.decode(encoded.reference_ids[:-1]) == item.reference


# --- the measures, on a tiny model ------------------------------------------------------------


@pytest.fixture
def policy(tiny_model_dir):
    return build_policy(tiny_model_dir, Config().train.model_copy(update={"lr": 1e-2}), "cpu")


def nudge(model, scale: float) -> None:
    """Move every LoRA B matrix off zero, as training would: the policy is no longer the base."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(scale * torch.randn_like(p))


def test_reference_logprobs_packed_and_padded_equal_each_item_scored_alone(policy, smol_tokenizer):
    items = encode(load_items("canary")[:5], smol_tokenizer)
    packed = reference_logprobs(policy.model, items, budget=160)  # several items per pass, left-padded
    for item, got in zip(items, packed, strict=True):
        ids = torch.tensor([item.prompt_ids + item.reference_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(item.prompt_ids) - 1 : -1]
        alone = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(item.reference_ids)[:, None])
        assert got == pytest.approx(float(alone.mean()), abs=1e-4)
    assert canary_score(packed) == pytest.approx(sum(math.exp(x) for x in packed) / 5)


def test_the_entropy_read_while_decoding_equals_a_forward_pass_along_the_answers(policy, smol_tokenizer):
    """`greedy_answers` reads each answer's mean entropy from its decoding steps; scoring the same
    answers (end of turn included where one ended) in a forward pass gives the same numbers. The
    tiny random model never says its end-of-turn token, so a token its first answer says at step 4
    plays that part: that answer ends there, the others wherever they say it."""
    items = encode(load_items("canary")[:4], smol_tokenizer)
    nudge(policy.model, 0.5)
    pad = smol_tokenizer.eos_token_id
    first, _ = greedy_answers(policy.model, items, pad, pad, budget=160)
    end = first[0][3]
    answers, entropies = greedy_answers(policy.model, items, pad, end, budget=160)
    assert len(answers[0]) <= 3 and len(answers[0]) < ANSWER_TOKENS
    _, forward = answer_scores(policy.model, as_answers(items, answers, end), budget=160)
    assert len(entropies) == 4 and all(e > 0 for e in entropies)
    assert entropies == pytest.approx(forward, rel=1e-3)


def test_forward_kl_is_zero_for_the_base_itself_and_matches_a_direct_sum_after_training(policy):
    turns = [([1, 9690, 198, 4093, 198, 1780], [4093, 30, 2]), ([1, 520, 9531], [25, 26, 27, 28])]
    base = policy.trainer.reference
    same, tokens = forward_kl(base, base, turns)
    assert same == pytest.approx(0.0, abs=1e-6) and tokens == 7
    nudge(policy.model, 0.5)
    kl, _ = forward_kl(lambda: nullcontext(policy.model), base, turns)
    direct = []
    for prompt, response in turns:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            new = torch.log_softmax(policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1], -1)
            with base() as b:
                old = torch.log_softmax(b(input_ids=ids).logits[0, len(prompt) - 1 : -1], -1)
        direct.append((old.exp() * (old - new)).sum(-1))
    assert kl > 0.01
    assert kl == pytest.approx(float(torch.cat(direct).mean()), rel=1e-3)


def test_replay_cycles_through_its_items_and_pulls_a_drifted_policy_back(policy, smol_tokenizer):
    items = encode(load_items("replay")[:3], smol_tokenizer)
    replay = Replay(items, fraction=0.5, batch_size=2, budget=512)
    assert replay.per_step == 2
    assert [i.id for i in replay.take() + replay.take()] == [items[k].id for k in (0, 1, 2, 0)]
    at_base = replay.backward(policy.trainer, step_tokens=10)
    assert at_base["replay_kl"] == pytest.approx(0.0, abs=1e-6)
    nudge(policy.model, 0.5)
    policy.optimizer.zero_grad()
    drifted = replay.backward(policy.trainer, step_tokens=10)
    assert drifted["replay_kl"] > 0.01 and drifted["replay_items"] == 2
    grads = [p.grad for n, p in policy.model.named_parameters() if "lora_" in n]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


# --- the gate in the trainer loop --------------------------------------------------------------


def test_a_version_that_forgets_is_held_and_the_trainer_goes_on_from_the_last_servable_one(run):  # noqa: F811
    """lr 0.5 moves a tiny random model (nearly uniform outputs) by a KL of ~0.03 in one step,
    past a limit of 0.01: the real canary measures it and holds the version.
    (The run's 40 recorded main turns are the real prompts its KL is read on.)"""
    config, store = run
    config = config.model_copy(update={"guard": GuardConfig(max_kl=0.01, kl_turns=4)})
    cfg = config.train.model_copy(update={"lr": 0.5})
    policy = build_policy(config.model.path, cfg, "cpu", keep_base=True)
    tokenizer = _tokenizer(config)
    canary = Canary.build(store, tokenizer, config.guard, policy.cfg.micro_batch_tokens)
    loop = TrainLoop(store, policy, config.run_dir, canary=canary.check)
    loop.resume()
    add(store, 8)
    assert loop.run_once()
    v1 = store.latest_version()
    assert v1.held and v1.canary["reason"] and v1.canary["kl"] > config.guard.max_kl
    assert set(v1.canary) >= {
        "score",
        "base_score",
        "drop",
        "kl",
        "kl_tokens",
        "seconds",
        "items",
        "collapse",
    }
    assert 0 <= v1.canary["accuracy"] <= 1 and 0 <= v1.canary["base_accuracy"] <= 1
    assert loop.run_once()  # the next step starts from v0 again, not from the held v1
    v2 = store.latest_version()
    assert v2.parent == "v0" and v2.step == 1


def test_a_version_past_a_collapse_limit_is_marked_and_held_only_with_hold_on_collapse(run):  # noqa: F811
    """The same forgetting step (lr 0.5), with the canary's own limits wide open: a drift limit of
    0.001 nats marks it; `guard.hold_on_collapse` turns the mark into a hold that names the figure.
    (The tiny random model answers every prompt alike already, self-ROUGE-L 1.0 at the base, so
    self-ROUGE-L, which counts only answers growing more alike than the base's, marks nothing.)"""
    config, store = run
    wide = {"max_drop": 1.0, "max_accuracy_drop": 1.0, "max_kl": 100.0, "kl_turns": 0}
    watch = GuardConfig(**wide, collapse_max_drift=0.001)
    cfg = config.train.model_copy(update={"lr": 0.5})
    statuses = {}
    for hold in (False, True):
        add(store, 8, start=8 * hold)  # each round's own samples: the second trains v2 from v1
        policy = build_policy(config.model.path, cfg, "cpu", keep_base=True)
        guard = watch.model_copy(update={"hold_on_collapse": hold})
        canary = Canary.build(store, _tokenizer(config), guard, policy.cfg.micro_batch_tokens)
        status, figures = canary.check(policy)  # the base itself: nothing drifted
        assert status == PASSED and figures["collapse"]["drift"] == 0.0, (
            figures["collapse"],
            figures["reason"],
        )
        assert figures["collapse"]["entropy_ratio"] == pytest.approx(1.0, abs=1e-4)
        loop = TrainLoop(store, policy, config.run_dir, canary=canary.check)
        loop.resume()
        assert loop.run_once()
        version = store.latest_version()
        statuses[hold] = version.status
        found = version.canary["collapse"]
        assert found["drift"] > 0.001 and "drift" in found["crossed"]
        assert found["base_entropy"] > 0 and 0 <= found["self_rouge_l"] <= 1
    assert statuses == {False: PASSED, True: HELD}
    assert "collapse: logprob drift" in store.latest_version().canary["reason"]
    assert "nats/token on the probes > 0.001" in store.latest_version().canary["reason"]


def _tokenizer(config: Config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.model.path)


def test_a_small_step_passes_and_is_the_next_version_trained_from(run):  # noqa: F811
    config, store = run
    cfg = config.train.model_copy(update={"lr": 1e-6})
    policy = build_policy(config.model.path, cfg, "cpu", keep_base=True)
    canary = Canary.build(store, _tokenizer(config), config.guard, policy.cfg.micro_batch_tokens)
    loop = TrainLoop(store, policy, config.run_dir, canary=canary.check)
    loop.resume()
    add(store, 8)
    assert loop.run_once() and loop.run_once()
    v1, v2 = store.versions()[1:]
    assert v1.status == v2.status == "passed" and abs(v1.canary["drop"]) < 0.01
    assert v2.parent == "v1"


def test_with_on_hold_rollback_a_copy_of_the_last_servable_version_is_published(run, capsys):  # noqa: F811
    config, store = run
    policy = build_policy(config.model.path, config.train, "cpu")
    held = {"score": 0.1, "drop": 0.5, "kl": 1.0, "seconds": 0.0, "reason": "made up for this test"}

    def rollback_to(target, user) -> None:  # the trainer's hook: the version, and whose line it is on
        from clawrl.train.publish import rollback

        rollback(store, config, target.name, user)

    loop = TrainLoop(store, policy, config.run_dir, canary=lambda p: (HELD, held), on_hold=rollback_to)
    loop.resume()
    add(store, 4)
    assert loop.run_once()
    names = [(v.name, v.status, v.metrics.get("rollback_of")) for v in store.versions()]
    assert names == [("v0", "unchecked", None), ("v1", "held", None), ("v2", "unchecked", "v0")]


def test_the_trainer_gets_replay_and_the_canary_only_as_configured(run):  # noqa: F811
    from clawrl.guard import trainer_hooks

    config, store = run
    off = config.model_copy(update={"guard": GuardConfig(enabled=False)})
    policy = build_policy(config.model.path, off.train, "cpu")
    assert trainer_hooks(off, store, policy, config.model.path, check=False) == (None, None)
    assert policy.trainer.replay is None
    replaying = off.model_copy(update={"train": off.train.model_copy(update={"replay_fraction": 0.5})})
    policy = build_policy(config.model.path, replaying.train, "cpu")
    assert trainer_hooks(replaying, None, policy, config.model.path, check=False) == (None, None)
    assert policy.trainer.replay.per_step == replaying.train.batch_size  # f / (1 - f) = 1
    rolling = config.model_copy(update={"guard": GuardConfig(on_hold="rollback")})
    check, on_hold = trainer_hooks(
        rolling, store, build_policy(config.model.path, config.train, "cpu"), config.model.path, check=True
    )
    assert check is not None and check.__self__.items and on_hold is not None


def test_a_versions_canary_status_and_figures_are_kept_by_the_store(db):
    from clawrl.types import Version

    with Store.open(db) as store:
        for n, status in ((1, "passed"), (2, "held"), (3, "held"), (4, "passed")):
            store.publish_version(Version(f"v{n}", n, f"/x/v{n}", status=status, canary={"n": n}), [])
        assert [(v.name, v.status, v.held) for v in store.versions()[1:]] == [
            ("v1", "passed", False),
            ("v2", "held", True),
            ("v3", "held", True),
            ("v4", "passed", False),
        ]
        assert store.versions()[2].canary == {"n": 2} and store.versions()[0].canary is None
        assert store.latest_version().name == "v4"


def test_clawrl_canary_measures_every_version_again_without_changing_its_status(run, capsys):  # noqa: F811
    from clawrl.cli import main

    config, store = run
    policy = build_policy(config.model.path, config.train, "cpu")
    canary = lambda p: (HELD, {"score": 0.0, "drop": 1.0, "kl": None, "seconds": 0.0, "reason": "test"})  # noqa: E731
    loop = TrainLoop(store, policy, config.run_dir, canary=canary)
    loop.resume()
    add(store, 4)
    assert loop.run_once()
    capsys.readouterr()
    assert main(["canary", "--run-dir", str(config.run_dir), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["version"], r["recorded"]) for r in rows] == [("v0", "unchecked"), ("v1", "held")]
    assert rows[0]["drop"] == 0.0 and rows[0]["kl"] == 0.0 and rows[1]["now"] in ("passed", "held")
    assert rows[0]["collapse"]["drift"] == 0.0 and rows[0]["collapse"]["crossed"] == []  # v0 is the base
    assert main(["canary", "v0", "--run-dir", str(config.run_dir)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("v0") and "; answer entropy 1.00 of the base's, self-ROUGE-L" in line
    assert "drift 0.000 nats" in line and "COLLAPSE" not in line
    assert store.versions()[1].status == "held"  # read-only: the recorded verdict stays
    assert main(["canary", "v9", "--run-dir", str(config.run_dir)]) == 2
    assert "no version v9" in capsys.readouterr().err
