"""Memory distilled into the weights and retired when learned (docs/memory.md): the distillation
sample of a turn served with a memory block, its place in the store's rules (one a turn, dropped
when an experience is erased, beside the method's samples), the trainer's importance weight taken
against the bare prompt, and the retirement probe on a tiny model with the real tokenizer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.algo import get_method
from clawrl.algo.distill import distillation_sample
from clawrl.algo.teacher import bare_prompt, teacher_prompt
from clawrl.chat.template import ChatRenderer
from clawrl.config import JudgeConfig, MemoryConfig, TrainConfig
from clawrl.judge.worker import JudgeLoop
from clawrl.memory import HEADER, answer_gap, experience_gap, next_state, render, with_memory
from clawrl.store.db import Store
from clawrl.store.writer import StoreWriter
from clawrl.testing import make_turn
from clawrl.train.batch import left_pad, score
from clawrl.train.memory_probe import MemoryProbe
from clawrl.train.trainer import Trainer
from clawrl.types import (
    EXPERIENCE_ACTIVE,
    EXPERIENCE_DISTILLED,
    EXPERIENCE_RETIRED,
    Experience,
    Feedback,
    Judgment,
    Sample,
    Version,
)

MESSAGES = [{"role": "user", "content": "How do I boil an egg?"}]
WISH = "Keep answers short and to the point."


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture
def store(db: Path):
    with Store.open(db) as s:
        s.upsert_session("s0", "header", 1.0)  # the session that taught the wishes
        s.upsert_session("s1", "header", 2.0)
        yield s


def served_turn(renderer: ChatRenderer, ids: list[int], block: str | None, turn_id: str = "t0", **kw):
    """A main turn as the gateway records it: the client's messages, the prompt rendered with the block."""
    messages = with_memory(MESSAGES, block) if block else MESSAGES
    prompt = renderer.render(messages, None).prompt_ids
    answer = renderer.tokenizer.encode("Boil it for nine minutes, then cool it.", add_special_tokens=False)
    memory = {"ids": ids, "block": block} if block else None
    values = {
        "messages": MESSAGES,
        "tools": None,
        "prompt_ids": prompt,
        "response_ids": answer,
        "memory": memory,
        "finish_reason": "stop",
        "logprobs": [-0.5] * len(answer),
        "temperature": 1.0,
        "rope_scaled": None,
    }
    return make_turn(turn_id, "s1", 0, **(values | kw))


def learnt(store: Store, *texts: str) -> list[int]:
    return [store.learn(text, f"teach{i}", "s0", now=1.0).id for i, text in enumerate(texts)]


# -- the sample (pure) ---------------------------------------------------------------------------


def test_a_turn_served_with_memory_gives_a_sample_taught_with_it_and_learnt_without(renderer):
    block = render_block(WISH)
    turn = served_turn(renderer, [3], block)
    bare = bare_prompt(renderer)(turn)
    sample = distillation_sample(turn, bare)
    assert sample is not None and sample.kind == "opd" and sample.experience_ids == [3]
    assert sample.prompt_ids == renderer.render(MESSAGES, None).prompt_ids != turn.prompt_ids
    assert sample.teacher_prompt_ids == turn.prompt_ids  # the served prompt, exactly
    assert WISH in renderer.tokenizer.decode(sample.teacher_prompt_ids)
    assert WISH not in renderer.tokenizer.decode(sample.prompt_ids)
    assert (sample.response_ids, sample.logprobs) == (turn.response_ids, turn.logprobs)  # never altered
    assert sample.reward == 0.0 and sample.hint is None and sample.judgment_id is None


def test_no_sample_without_a_block_a_dropped_block_or_an_untrainable_turn(renderer):
    bare = bare_prompt(renderer)
    dropped = served_turn(renderer, [], None, memory={"ids": [], "dropped": "window", "picked": [3]})
    side = served_turn(renderer, [3], render_block(WISH), turn_type="side")
    aborted = served_turn(renderer, [3], render_block(WISH), finish_reason="abort")
    for turn in (served_turn(renderer, [], None), dropped, side, aborted):
        assert distillation_sample(turn, bare(turn)) is None


def render_block(*texts: str) -> str:
    return render([Experience(t, [], []) for t in texts])


# -- the retirement rule (pure) ------------------------------------------------------------------


def test_the_gap_is_teacher_minus_student_per_token_and_its_size_over_answers():
    assert answer_gap([-1.0, -2.0], [-1.5, -3.0]) == pytest.approx(0.75)
    assert experience_gap([0.75, -0.25]) == pytest.approx(0.5)  # |g| : a gap either way is an effect
    assert experience_gap([]) is None
    with pytest.raises(ValueError):
        answer_gap([-1.0], [])


def test_distilled_under_one_threshold_active_over_the_other_and_retired_stays():
    rule = dict(distilled_below=0.05, active_above=0.15)
    assert next_state(EXPERIENCE_ACTIVE, 0.01, **rule) == EXPERIENCE_DISTILLED
    assert next_state(EXPERIENCE_ACTIVE, 0.10, **rule) == EXPERIENCE_ACTIVE  # between: stays
    assert next_state(EXPERIENCE_DISTILLED, 0.10, **rule) == EXPERIENCE_DISTILLED
    assert next_state(EXPERIENCE_DISTILLED, 0.30, **rule) == EXPERIENCE_ACTIVE  # the effect was lost
    assert next_state(EXPERIENCE_RETIRED, 0.0, **rule) == EXPERIENCE_RETIRED
    with pytest.raises(ValueError, match="active_above"):
        MemoryConfig(distilled_below=0.2, active_above=0.1)


# -- the store's rules ---------------------------------------------------------------------------


def test_one_distillation_sample_a_turn_and_none_for_an_erased_experience(store, renderer):
    (e,) = learnt(store, WISH)
    turn = served_turn(renderer, [e], render_block(WISH))
    store.insert_turn(turn)
    sample = distillation_sample(turn, bare_prompt(renderer)(turn))
    assert store.insert_distillation(sample) is not None
    again = distillation_sample(turn, bare_prompt(renderer)(turn))
    assert store.insert_distillation(again) is None  # the turn judged again
    assert store.count_samples("ready") == 1 and store.counters()["memory:samples"] == 1
    (back,) = store.ready_samples()
    assert back.experience_ids == [e] and back.teacher_prompt_ids == turn.prompt_ids

    store.forget(e, now=5.0)
    assert store.sample_status(back.id) == ("skipped", f"experience erased: {e} was retired by its user")
    other = served_turn(renderer, [e], render_block(WISH), turn_id="t1")
    store.insert_turn(other)
    assert store.insert_distillation(distillation_sample(other, bare_prompt(renderer)(other))) is None


def test_a_sample_with_a_non_finite_logprob_breaks_no_memory_rule(store, renderer):
    """json.dumps writes NaN, which SQLite's JSON functions refuse: the rules read such a payload as
    no distillation sample's instead of failing the statement (the trainer skips it later)."""
    (e,) = learnt(store, WISH)
    turn = served_turn(renderer, [e], render_block(WISH))
    store.insert_turn(turn)
    (broken,) = get_method("rl").samples(turn, Judgment(turn.id, "j", [], score=1, hint=None), None)
    broken.logprobs = [float("nan")] * len(broken.logprobs)
    store.insert_judgment(Judgment(turn.id, "j", [], score=1, hint=None), [broken])
    store.insert_distillation(distillation_sample(turn, bare_prompt(renderer)(turn)))
    store.insert_judgment(Judgment(turn.id, "j", [], score=-1, hint=None), [])
    store.forget(e, now=5.0)
    assert store.sample_status(broken.id)[0] == "superseded" and store.counters()["memory:samples"] == 1


def test_the_distillation_sample_and_the_methods_do_not_supersede_or_block_each_other(store, renderer):
    (e,) = learnt(store, WISH)
    turn = served_turn(renderer, [e], render_block(WISH))
    store.insert_turn(turn)
    distil = distillation_sample(turn, bare_prompt(renderer)(turn))
    store.insert_distillation(distil)
    rated = Judgment(turn.id, "feedback", [], score=1, hint=None)
    store.insert_judgment(rated, get_method("combine").samples(turn, rated, teacher_prompt(renderer)))
    assert store.sample_status(distil.id)[0] == "ready"  # a judgment does not supersede it
    store.claim_samples([distil.id])
    store.publish_version(_version("v1"), trained=[distil.id])  # the distillation sample is trained
    hinted = Judgment(turn.id, "judge", [], score=-1, hint="Be brief.")
    (opd,) = get_method("combine").samples(turn, hinted, teacher_prompt(renderer))
    store.insert_judgment(hinted, [opd])
    assert opd.id is not None  # a trained distillation sample does not count as the turn's opd
    assert store.sample_status(opd.id)[0] == "ready"


def test_training_the_turns_opd_sample_leaves_its_distillation_sample_ready(store, renderer):
    (e,) = learnt(store, WISH)
    turn = served_turn(renderer, [e], render_block(WISH))
    store.insert_turn(turn)
    hinted = Judgment(turn.id, "judge", [], score=-1, hint="Be brief.")
    (opd,) = get_method("combine").samples(turn, hinted, teacher_prompt(renderer))
    store.insert_judgment(hinted, [opd])
    distil = distillation_sample(turn, bare_prompt(renderer)(turn))
    store.insert_distillation(distil)
    store.claim_samples([opd.id])
    store.publish_version(_version("v1"), trained=[opd.id])
    assert store.sample_status(distil.id) == ("ready", None)  # not "its turn was trained on (this kind)"


def _version(name: str) -> Version:
    return Version(name, 1, None, {}, "v0")


def test_the_probe_moves_active_and_distilled_but_never_a_retired_experience(store):
    kept, erased = learnt(store, WISH, "Answer in French please.")
    store.forget(erased, now=2.0)
    assert store.probed(kept, EXPERIENCE_DISTILLED, 0.01, now=3.0).state == EXPERIENCE_DISTILLED
    assert all(e.id != kept for e in store.recall_candidates(WISH))  # no longer injected
    assert store.probed(erased, EXPERIENCE_DISTILLED, 0.0, now=3.0).state == EXPERIENCE_RETIRED
    back = store.probed(kept, EXPERIENCE_ACTIVE, 0.4, now=4.0)
    assert (back.state, back.gap, back.probed_at) == (EXPERIENCE_ACTIVE, 0.4, 4.0)
    assert [e.id for e in store.recall_candidates(WISH)] == [kept]
    counters = store.counters()
    assert counters["memory:distilled"] == 1 and counters["memory:reactivated"] == 1
    assert [e.id for e in store.probed_experiences(10)] == [kept]


# -- the judge loop writes it ---------------------------------------------------------------------


def _judge(db: Path, renderer: ChatRenderer, bare, turn_id: str = "t0"):
    async def run():
        with Store.open(db) as store:
            writer = StoreWriter(retry_every_s=1.0, max_pending=100)
            writer.start()
            loop = JudgeLoop(store, writer, None, get_method("combine"), teacher_prompt(renderer),
                             JudgeConfig(), memory=MemoryConfig(), bare=bare)  # fmt: skip
            try:
                j = await loop.judge(turn_id)
            finally:
                await writer.stop()
            return j, loop.health(), store.ready_samples()

    return asyncio.run(run())


def test_judging_a_turn_served_with_memory_writes_its_distillation_sample_once(store, db, renderer):
    (e,) = learnt(store, WISH)
    turn = served_turn(renderer, [e], render_block(WISH))
    store.insert_turn(turn)
    store.add_feedback(Feedback(turn.id, 1, None, 3.0))
    j, health, ready = _judge(db, renderer, bare_prompt(renderer))
    assert j.score == 1 and health.distilled == 1 and health.memory_failures == 0
    distil = [s for s in ready if s.experience_ids]
    assert [s.prompt_ids for s in distil] == [renderer.render(MESSAGES, None).prompt_ids]
    assert [s.kind for s in ready if not s.experience_ids] == ["rl"]  # the method's, beside it
    _, again, ready = _judge(db, renderer, bare_prompt(renderer))  # judged again: no second one
    assert again.distilled == 0 and len([s for s in ready if s.experience_ids]) == 1


def test_a_failed_distillation_never_blocks_judging(store, db, renderer):
    (e,) = learnt(store, WISH)
    store.insert_turn(served_turn(renderer, [e], render_block(WISH)))
    store.add_feedback(Feedback("t0", -1, None, 3.0))

    def broken(turn):
        raise RuntimeError("the template cannot render")

    j, health, ready = _judge(db, renderer, broken)
    assert j is not None and j.score == -1 and health.memory_failures == 1 and health.distilled == 0
    assert [s.kind for s in ready] == ["rl"]
    _, off, _ = _judge(db, renderer, None)  # memory.distill off
    assert off.distilled == 0 and off.memory_failures == 0


# -- the trainer and the probe on a tiny model ----------------------------------------------------


@torch.no_grad()
def _logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    batch = left_pad([prompt], [response], torch.device("cpu"))
    return score(model, batch, torch.ones(1), with_entropy=False)[0][0, : len(response)].tolist()


def test_the_importance_weight_is_taken_against_the_bare_prompt(tiny_model_dir, renderer):
    """mu was recorded under the served (longer) prompt; the trainer's pi_prox is scored on the
    sample's student prompt, so w_t = min(exp(prox_t - mu_t), C) != 1 and the measured mismatch is
    the bare-vs-memory gap, while the same mu against its own prompt weighs 1."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    turn = served_turn(renderer, [1], render_block(WISH))
    mu = _logprobs(model, turn.prompt_ids, turn.response_ids)
    turn.logprobs = mu
    sample = distillation_sample(turn, bare_prompt(renderer)(turn))
    bare = _logprobs(model, sample.prompt_ids, turn.response_ids)
    expected = sum(abs(b - m) for b, m in zip(bare, mu, strict=True)) / len(mu)
    assert expected > 0.01

    def step(s: Sample) -> dict:
        m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        return Trainer(m, opt, TrainConfig(kl_coef=0.0, weights="full", is_cap=100.0)).step([s])

    distilled = step(sample)
    assert distilled["mismatch"] == pytest.approx(expected, rel=1e-3)
    # not 1: the tiny random model moves it by 0.006 with today's header (float32 noise is ~1e-7)
    assert abs(distilled["is_weight_mean"] - 1.0) > 1e-3 and distilled["samples_memory"] == 1
    served = Sample(turn.id, "opd", turn.prompt_ids, turn.response_ids, mu, "v0", 1.0,
                    teacher_prompt_ids=turn.prompt_ids)  # fmt: skip
    on_policy = step(served)
    assert on_policy["mismatch"] < 1e-4 and on_policy["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)


def test_the_probe_marks_an_experience_distilled_and_active_again_by_the_measured_gap(
    store, tiny_model_dir, renderer
):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    wish, erased = learnt(store, WISH, "Answer in French please.")
    store.forget(erased, now=2.0)
    for i in range(3):
        store.insert_turn(served_turn(renderer, [], None, turn_id=f"t{i}", created_at=10.0 + i))

    def probe(**cfg) -> list:
        MemoryProbe(store, model, renderer, MemoryConfig(**cfg)).run()
        return store.experiences()

    found = {e.id: e for e in probe(distilled_below=0.0, active_above=0.0)}
    gap = found[wish].gap
    assert gap is not None and gap > 0 and found[wish].state == EXPERIENCE_ACTIVE  # memory changes it
    assert found[erased].state == EXPERIENCE_RETIRED and found[erased].gap is None

    (turn,) = store.recent_main_turns(1)

    def scored(block: str) -> list[float]:
        prompt = renderer.render(with_memory(MESSAGES, block), None).prompt_ids
        return _logprobs(model, prompt, turn.response_ids)

    with_it, header = scored(render_block(WISH)), scored(HEADER)  # the reference: the header alone
    assert gap == pytest.approx(abs(answer_gap(with_it, header)), rel=1e-4)  # every turn asks the same

    found = {e.id: e for e in probe(distilled_below=gap * 1.01, active_above=gap * 2)}
    assert found[wish].state == EXPERIENCE_DISTILLED
    found = {e.id: e for e in probe(distilled_below=gap * 0.5, active_above=gap * 0.9)}
    assert found[wish].state == EXPERIENCE_ACTIVE
    assert store.counters()["memory:distilled"] == 1 and store.counters()["memory:reactivated"] == 1


def test_the_probe_stops_at_its_time_budget(store, tiny_model_dir, renderer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    learnt(store, WISH, "Answer in French please.", "Use metric units.")
    store.insert_turn(served_turn(renderer, [], None))

    def run() -> set[int]:
        ticks = iter(range(100))  # one "second" a look at the clock: the deadline is 2.5 after the start
        MemoryProbe(store, model, renderer, MemoryConfig(probe_budget_s=2.5), clock=lambda: next(ticks)).run()
        return {e.id for e in store.experiences() if e.probed_at is not None}

    first = run()
    assert len(first) == 2  # the third waits for the next version
    assert len(run()) == 3  # ... and is probed first then (the least recently probed first)
