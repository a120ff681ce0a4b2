"""The retirement probe: after a version is published, is each experience already in the weights?

On the `memory.probe_turns` newest main turns (the owner's prompts), the trainer scores each
turn's own answer under the client's messages with an empty memory block (the header alone: the
reference, see clawrl/memory/retire.py for why not the bare messages) and under those messages
with a memory block of one experience; the rule of clawrl/memory/retire.py turns the gaps into `active` or
`distilled`, and the store records the state, the gap and when (`Store.probed`). A `distilled`
experience is no longer offered to requests; one whose gap grows again is `active` again.

Run only with memory on (`memory.enabled`: with it off no experience is injected, so none is
retired; clawrl/wiring/trainer.py builds no probe), and only after a version whose step (its
training steps from the base, rollbacks included) is a multiple of `memory.probe_every` (4): a
step number rather than a count kept in the process, so a restarted trainer keeps the rhythm.

Bounded: at most `memory.probe_experiences` experiences a run (the least recently probed first),
one forward pass a turn for the bare prompt and one a turn and experience, stopped once
`memory.probe_budget_s` has passed (the rest wait for the next version). It runs in the trainer
process, between steps, so serving never waits for it; a failure is logged and training goes on.
Under a lockstep group (FSDP: every forward is a collective) it does not run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from clawrl.chat.template import ChatRenderer
from clawrl.config import MemoryConfig
from clawrl.memory import answer_gap, experience_gap, next_state, render, with_memory
from clawrl.store.db import Store
from clawrl.train.batch import left_pad, score
from clawrl.types import Experience, Turn, Version

log = logging.getLogger(__name__)


class MemoryProbe:
    def __init__(
        self,
        store: Store,
        model: torch.nn.Module,
        renderer: ChatRenderer,
        cfg: MemoryConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.model, self.renderer, self.cfg, self.clock = store, model, renderer, cfg, clock
        self.device = next(model.parameters()).device

    def after_publish(self, version: Version) -> None:
        """The probe, for the version just published when its step is a multiple of
        `memory.probe_every`; never raises (see the module)."""
        if version.step % self.cfg.probe_every:
            return
        try:
            changed = self.run()
        except Exception:  # degrade on purpose: the probe is a bonus, training must go on
            log.exception("the memory retirement probe after %s failed; training goes on", version.name)
            return
        for e in changed:
            log.info("memory: experience %s is %s now (gap %.3f nats a token)", e.id, e.state, e.gap or 0.0)

    def run(self) -> list[Experience]:
        """Probe the experiences due; the ones whose state changed, as they are now."""
        turns = self.store.recent_main_turns(self.cfg.probe_turns)
        experiences = self.store.probed_experiences(self.cfg.probe_experiences)
        if not turns or not experiences:
            return []
        deadline = self.clock() + self.cfg.probe_budget_s
        reference = [self._logprobs(self._prompt(t, []), t) for t in turns]
        changed = []
        for e in experiences:
            if self.clock() > deadline:
                break
            pairs = zip(turns, reference, strict=True)
            gap = experience_gap([answer_gap(self._logprobs(self._prompt(t, [e]), t), r) for t, r in pairs])
            assert gap is not None  # turns is not empty
            state = next_state(e.state, gap, self.cfg.distilled_below, self.cfg.active_above)
            now = self.store.probed(e.id or 0, state, gap, time.time())
            if now is not None and now.state != e.state:
                changed.append(now)
        return changed

    def _prompt(self, turn: Turn, lines: list[Experience]) -> list[int]:
        """The turn's client messages with a memory block of these experiences (none: the header alone)."""
        return self.renderer.render(with_memory(turn.messages, render(lines)), turn.tools).prompt_ids

    @torch.no_grad()
    def _logprobs(self, prompt_ids: list[int], turn: Turn) -> list[float]:
        """log pi(a_t | prompt) of the turn's answer tokens, at the temperature it was sampled at."""
        batch = left_pad([prompt_ids], [list(turn.response_ids)], self.device)
        batch.rope = [turn.rope_scaled]
        temps = torch.tensor([turn.temperature or 1.0], device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            logp = score(self.model, batch, temps, with_entropy=False)[0]
        finally:
            self.model.train(was_training)
        return [float(x) for x in logp[0, : len(turn.response_ids)]]
