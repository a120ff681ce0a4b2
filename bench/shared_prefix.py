"""A training step on 4 OpenClaw-like turns behind one ~2,300-token system prompt: each row running
its whole prompt vs the prompt shared once per micro-batch (`train.share_prefixes`).

OpenClaw's turns carry ~2,500-token prompts for ~40-token answers, and every turn starts with the
agent's system prompt (issue 55: 2,296 shared tokens of 2,526). Four such turns of four different
conversations are not a session (train/packing.py does not apply), so each row ran the prompt in
the policy's, the reference's and the teacher's passes. clawrl/train/sharing.py runs it once per
micro-batch. The turns are built here with the embedded model's tokenizer and chat template: a
system prompt of tool descriptions and rules, a short user message, a ~40-token answer; two are
`rl` samples, two `opd` with a hint appended to the user message (a teacher pass). The step is
`Trainer.step` on the embedded model with LoRA (clawrl's CPU defaults: 2,048-token micro-batches,
KL on), both ways, alternating, after one warm-up step each (or none: the shared step then goes
first and pays the first step's costs). Figures: the tokens every forward processed (padding
included: a hook on the input embedding) per answer token trained, and the step's time (wall, and
this process's CPU seconds, steadier on a shared machine); ratios shared / alone in the same run.

    nice -n 15 .venv/bin/python bench/shared_prefix.py [--rounds 2] [--no-warmup]
"""

from __future__ import annotations

import argparse
import statistics
import time

from clawrl.config import Config, TrainConfig
from clawrl.model.load import ensure_embedded
from clawrl.types import Sample

TOOLS = ["read", "write", "edit", "exec", "process", "browser", "canvas", "nodes", "cron", "message",
         "gateway", "sessions_list", "sessions_send", "memory_search", "memory_get", "web_search",
         "web_fetch", "image", "tts", "agents_list"]  # fmt: skip
QUESTIONS = [
    "What's a good name for a grey cat?",
    "Remind me how to undo the last git commit.",
    "How long should I boil an egg for a soft yolk?",
    "Translate 'good morning' into Italian.",
]
ANSWER = (
    "Sure, a short answer to that: {q} The usual way is the simplest one, and I can say more if you want."
)


def system_prompt(tokens: int, count) -> str:
    """OpenClaw-like: an identity, then tool descriptions and rules until `tokens` tokens."""
    lines = ["You are a personal assistant running inside OpenClaw.", "## Tooling"]
    k = 0
    while count("\n".join(lines)) < tokens:
        tool = TOOLS[k % len(TOOLS)]
        rule = f"keep calls short, quote paths exactly, never guess arguments, report what {tool} returned"
        lines.append(f"- {tool}: use {tool} when the user asks for it (rule {k}); {rule}.")
        k += 1
    return "\n".join(lines)


def openclaw_turns(tokenizer) -> list[Sample]:
    """Four first turns of four conversations behind one system prompt: 2 rl, 2 opd (hinted)."""
    system = system_prompt(2300, lambda text: len(tokenizer(text)["input_ids"]))

    def render(user: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )

    out = []
    for i, q in enumerate(QUESTIONS):
        answer = tokenizer(ANSWER.format(q=q))["input_ids"] + [tokenizer.eos_token_id]
        opd = i % 2 == 1
        hinted = render(q + "\n\n[Hindsight hint] Answer in one sentence.") if opd else None
        out.append(Sample(f"t{i}", "opd" if opd else "rl", render(q), answer, [-1.5] * len(answer), "v0", 1.0,
                          reward=1.0 if i % 2 == 0 else -1.0, id=i, teacher_prompt_ids=hinted,
                          rope_scaled=False))  # fmt: skip
    return out


def measure(samples: list[Sample], rounds: int, warmup: bool) -> dict[str, dict[str, float]]:
    from clawrl.train.policy import build_policy

    model = ensure_embedded(Config().cache_dir())
    out: dict[str, dict[str, list[float]]] = {"shared": {}, "alone": {}}  # no warm-up: shared pays the first
    policies, processed = {}, {"n": 0}
    for name in out:
        policies[name] = build_policy(model, TrainConfig(share_prefixes=name == "shared", lr=1e-6), "cpu")
        embed = policies[name].trainer.model.get_input_embeddings()
        embed.register_forward_hook(lambda m, a, o: processed.__setitem__("n", processed["n"] + a[0].numel()))
        if warmup:
            policies[name].trainer.step(samples)
    for _ in range(rounds):
        for name, policy in policies.items():
            processed["n"] = 0
            cpu = time.process_time()
            m = policy.trainer.step(samples)
            cpu = time.process_time() - cpu  # this process's CPU seconds: steadier than wall when shared
            figures = {
                "step_s": m["step_s"],
                "cpu_s": cpu,
                "tokens": m["tokens"],
                "processed": processed["n"],
            }
            for key, value in figures.items():
                out[name].setdefault(key, []).append(value)
    return {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="timed steps of each kind (default 2)")
    ap.add_argument(
        "--no-warmup", action="store_true", help="no warm-up step (the shared step then goes first)"
    )
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded(Config().cache_dir()))
    samples = openclaw_turns(tokenizer)
    prompts = [len(s.prompt_ids) for s in samples]
    shared = _common(samples)
    figures = measure(samples, args.rounds, not args.no_warmup)
    a, s = figures["alone"], figures["shared"]
    print(f"\n4 turns, prompts {prompts} tokens ({shared} shared), {int(a['tokens'])} answer tokens "
          f"trained (2 rl, 2 opd); the embedded model, LoRA, KL on, CPU defaults; median of {args.rounds} "
          "steps")  # fmt: skip
    print(
        "| prompt | tokens processed per step | processed / trained | step (wall) | ratio | CPU s | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, f in (("each row its own", a), ("shared once per micro-batch", s)):
        per = f["processed"] / f["tokens"]
        wall, cpu = (
            f"{f['step_s']:.1f} s | {f['step_s'] / a['step_s']:.2f}",
            f"{f['cpu_s']:.1f} | {f['cpu_s'] / a['cpu_s']:.2f}",
        )
        print(f"| {name} | {int(f['processed']):,} | {per:.1f} | {wall} | {cpu} |")
    print(f"processed ratio shared / alone: {s['processed'] / a['processed']:.2f}")


def _common(samples: list[Sample]) -> int:
    first = samples[0].prompt_ids
    return min(
        next((i for i, (x, y) in enumerate(zip(first, s.prompt_ids, strict=False)) if x != y), len(first))
        for s in samples
    )


if __name__ == "__main__":
    main()
