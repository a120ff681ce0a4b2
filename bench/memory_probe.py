"""The memory retirement probe on the embedded model: its cost, and whether its gap tells apart
answers written under a wish from answers written without it.

Run: .venv/bin/python bench/memory_probe.py [--answer-tokens 32] [--threads 1] [--json PATH]

Four questions are answered greedily by the embedded SmolLM2-135M-Instruct twice: with a bare
prompt, and with a memory block of one wish ("Answer in French please.", "Call me Sam.", ...)
in the system prompt, as the gateway serves them. Each set of answers is recorded as turns in a
fresh store, and `MemoryProbe.run` (clawrl/train/memory_probe.py) measures every wish on them,
as the trainer does after a version. Printed: each wish's gap (mean |logprob gap| a token, with
the wish and with the memory header alone) on the answers written without it and on those
written with it, and the probe's time and forward passes. A wish the model follows should show a
larger gap on the answers written under it; `memory.distilled_below` (0.05) and `active_above`
(0.15) are read against these figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

QUESTIONS = [
    "What should I pack for a weekend in the mountains?",
    "How do I make a cup of tea?",
    "Why is the sky blue?",
    "Can you suggest a name for a black cat?",
]
WISHES = ["Answer in French please.", "Keep answers short and to the point.", "Use bullet points.",
          "Call me Sam."]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answer-tokens", type=int, default=32, help="greedy answer length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawrl.chat.template import ChatRenderer
    from clawrl.config import Config, MemoryConfig
    from clawrl.memory import render, with_memory
    from clawrl.model.load import ensure_embedded
    from clawrl.store.db import Store
    from clawrl.testing import make_turn
    from clawrl.train.memory_probe import MemoryProbe
    from clawrl.types import Experience

    torch.set_num_threads(args.threads)
    folder = ensure_embedded(Config().cache_dir())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(folder))

    def answer(messages: list[dict]) -> list[int]:
        prompt = renderer.render(messages, None).prompt_ids
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=args.answer_tokens, do_sample=False)
        return out[0, len(prompt) :].tolist()

    figures: dict = {"wishes": {}}
    for wish in WISHES:
        block = render([Experience(wish, [], [])])
        gaps = {}
        for written in ("without", "with"):
            with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "clawrl.db") as store:
                store.upsert_session("s1", "header", 1.0)
                e = store.learn(wish, "taught", "s0", now=1.0)
                for i, q in enumerate(QUESTIONS):
                    messages = [{"role": "user", "content": q}]
                    served = with_memory(messages, block) if written == "with" else messages
                    store.insert_turn(make_turn(f"t{i}", "s1", i, messages=messages, tools=None,
                                                response_ids=answer(served), temperature=1.0,
                                                finish_reason="stop", rope_scaled=None))  # fmt: skip
                start = time.perf_counter()
                MemoryProbe(store, model, renderer, MemoryConfig(probe_budget_s=600)).run()
                took = time.perf_counter() - start
                gaps[written] = store.experience(e.id).gap
                figures["probe_s"] = took
        figures["wishes"][wish] = gaps
        print(f"{wish:40} gap on answers written without it {gaps['without']:.3f}, "
              f"with it {gaps['with']:.3f} nats a token", flush=True)  # fmt: skip
    passes = 2 * len(QUESTIONS)  # the header-only prompt and the wish's, a turn
    took = figures["probe_s"]
    each = f"{took / passes:.2f} s each, {args.answer_tokens}-token answers, {args.threads} thread"
    print(f"one probe of one wish on {len(QUESTIONS)} turns: {took:.2f} s, {passes} forward passes ({each})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
