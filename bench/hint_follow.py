"""Does the model meet a persona's preference when the hint is in its prompt? The teacher's reach.

Run: .venv/bin/python bench/hint_follow.py configs/personas/bold.toml [more.toml ...] [--tasks 8]
                                          [--samples 2] [--model DIR] [--best-of K]

Every method that learns from the policy's own hindsight (opd's rescoring, rewrites, memory
distillation) can teach only what the policy writes when it is told. For each persona file this
samples answers to its first `--tasks` tasks as the server would (the model's own sampling
defaults), once with the bare question and once with every check's first hint appended as the
teacher prompt appends it (`[Hindsight hint] ...`, clawrl/algo/teacher.py), and prints how many of
each met the persona's checks, the ratio of the two measured in the same run, and the mean score.
A preference the hinted model never meets cannot be distilled from it.

`--best-of K` measures the rewriter's selection (`train.hint_rewrite_candidates`,
clawrl/judge/rewriter.py) instead: per task, K hinted answers sampled at once, and how many tasks'
kept answer (the largest sum of log p(t | hinted) - log p(t | bare)) meets the checks, against the
mean over the K (one answer unscored) and the tasks where any of the K does (the ceiling), at
`--temperature` (1.0, as `clawrl eval`'s training turns and so their rewrites are sampled).

`--greedy` measures what the held-out eval scores: greedy answers of at most 128 tokens (clawrl
eval's limit), bare and under each teacher prompt the loop can build from the persona's complaint
after that bare answer (`train.hint_placement`, clawrl/algo/teacher.py): `append` with the
next-state hint the default judge gives ("After a first answer to this, the user replied: ..."),
`append` with the check's written hint, and `follow_up` (the bare answer, then the complaint as
the user's next message). Distillation moves the policy towards the teacher; a preference the
teacher's greedy answer does not meet is one its greedy answer will not learn from it. Printed:
tasks met per prompt, and the answers cut at the limit (which an `ends_with` check can never meet).
`--guidance BETA` compares the written hint appended with its effect amplified (classifier-free
guidance, the logits bare + BETA * (hinted - bare)): what a teacher sharpened towards the hint
would write. `--show` prints each answer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawrl.algo.teacher import HINT_INTRO, HINT_PREFIX, enhanced_messages, follow_up_messages  # noqa: E402
from clawrl.eval.personas.file import load_persona  # noqa: E402
from clawrl.eval.tasks import load_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("personas", nargs="+", type=Path)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--model", type=Path, help="a model folder (default: the embedded model)")
    parser.add_argument("--best-of", type=int, default=0, help="measure best-of-K rewrite selection")
    parser.add_argument("--greedy", action="store_true", help="greedy answers under each teacher prompt")
    parser.add_argument(
        "--show", action="store_true", help="--greedy: print each answer's last 160 characters"
    )
    parser.add_argument(
        "--guidance", type=float, default=0.0, help="--greedy: also the written hint's effect times this"
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="--best-of's sampling (clawrl eval's turns: 1.0)"
    )
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    folder = args.model or ensure_embedded(Config().cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    sampling = GenerationConfig.from_pretrained(folder)
    torch.manual_seed(0)

    def ids_of(question: str | list[dict]):
        messages = [{"role": "user", "content": question}] if isinstance(question, str) else question
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]

    def greedy(messages: list[dict], bare: list[dict] | None = None) -> tuple[str, bool]:
        """The greedy answer (128 tokens at most) and whether the limit cut it; with `bare`, guided:
        at every token the logits bare + beta * (hinted - bare) (`--guidance` beta)."""
        ids = ids_of(messages)
        guided = {"guidance_scale": args.guidance, "negative_prompt_ids": ids_of(bare)} if bare else {}
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=128, do_sample=False, pad_token_id=tokenizer.eos_token_id, **guided
            )
        answer = out[0][ids.shape[1] :]
        return tokenizer.decode(
            answer, skip_special_tokens=True
        ), tokenizer.eos_token_id not in answer.tolist()

    if args.greedy:
        prompts = ("bare", "append, next-state hint", "append, written hint", "follow_up")
        if args.guidance:
            prompts = ("bare", "append, written hint", f"guided {args.guidance:g}, written hint")
        print("| persona | tasks | " + " | ".join(f"{p}: met (cut)" for p in prompts) + " |")
        print("| --- | --- |" + " --- |" * len(prompts))
        for path in args.personas:
            persona = load_persona(path)
            tasks = (persona.tasks or load_tasks("math"))[: args.tasks]
            counts = {p: [0, 0] for p in prompts}
            written = " ".join(rule.hints[0] for rule in persona.rules)
            for task in tasks:
                question = [{"role": "user", "content": persona.first_message(task)}]
                first, cut = greedy(question)
                reply = persona.reply(task, first, 1).message or ""
                teachers = {
                    "append, next-state hint": enhanced_messages(question, HINT_INTRO["user"] + reply),
                    "append, written hint": enhanced_messages(question, written),
                    "follow_up": follow_up_messages(question, {"role": "assistant", "content": first}, reply),
                }
                for name in prompts:
                    if name == "bare":
                        text, cut_here = first, cut
                    elif name.startswith("guided"):  # the written hint, guided away from the bare question
                        text, cut_here = greedy(teachers["append, written hint"], bare=question)
                    else:
                        text, cut_here = greedy(teachers[name])
                    if args.show:
                        print(f"  {persona.name} {task.id} {name}: {text[-160:]!r}", flush=True)
                    counts[name][0] += persona.score(task, text) >= 1.0
                    counts[name][1] += cut_here
            cells = " | ".join(f"{met} ({cut})" for met, cut in counts.values())
            print(f"| `{persona.name}` | {len(tasks)} | {cells} |", flush=True)
        return

    def answer(question: str) -> str:
        ids = ids_of(question)
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=200,
                do_sample=True,
                temperature=sampling.temperature or 1.0,
                top_p=sampling.top_p or 1.0,
                pad_token_id=tokenizer.eos_token_id,
            )
        return tokenizer.decode(out[0][ids.shape[1] :], skip_special_tokens=True)

    def logps(prompt, answer):
        with torch.no_grad():
            logits = model(torch.cat([prompt, answer], 1)).logits[0, prompt.shape[1] - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(1, answer[0][:, None])[:, 0]

    if args.best_of:
        k = args.best_of
        print(
            f"| persona | tasks | one answer met (mean over {k}) | best of {k} by hint gain met "
            f"| any of {k} met |"
        )
        print("| --- | --- | --- | --- | --- |")
        for path in args.personas:
            persona = load_persona(path)
            tasks = (persona.tasks or load_tasks("math"))[: args.tasks]
            hint = " ".join(rule.hints[0] for rule in persona.rules)
            one = best = anyone = 0.0
            for task in tasks:
                question = persona.first_message(task)
                hinted, bare = ids_of(f"{question}\n\n{HINT_PREFIX}{hint}"), ids_of(question)
                with torch.no_grad():
                    out = model.generate(
                        hinted.repeat(args.best_of, 1),
                        attention_mask=torch.ones_like(hinted).repeat(args.best_of, 1),
                        max_new_tokens=200,
                        do_sample=True,
                        temperature=args.temperature,
                        top_p=1.0,
                        pad_token_id=tokenizer.eos_token_id,
                    )
                drafts = []
                for row in out:
                    answer = row[hinted.shape[1] :]
                    ends = (answer == tokenizer.eos_token_id).nonzero()
                    answer = answer[: int(ends[0]) + 1] if len(ends) else answer
                    gain = float((logps(hinted, answer[None]) - logps(bare, answer[None])).sum())
                    met = persona.score(task, tokenizer.decode(answer, skip_special_tokens=True)) >= 1.0
                    drafts.append((gain, met))
                one += sum(m for _, m in drafts) / len(drafts)
                best += max(drafts)[1]
                anyone += any(m for _, m in drafts)
            print(f"| `{persona.name}` | {len(tasks)} | {one:.2f} | {best:.0f} | {anyone:.0f} |", flush=True)
        return

    print("| persona | bare: met (mean score) | hinted: met (mean score) | hinted / bare met |")
    print("| --- | --- | --- | --- |")
    for path in args.personas:
        persona = load_persona(path)
        tasks = persona.tasks or load_tasks("math")
        hint = " ".join(rule.hints[0] for rule in persona.rules)
        row = []
        for hinted in (False, True):
            met, scores = 0, []
            for task in tasks[: args.tasks]:
                question = persona.first_message(task)
                question = f"{question}\n\n{HINT_PREFIX}{hint}" if hinted else question
                for _ in range(args.samples):
                    score = persona.score(task, answer(question))
                    met += score >= 1.0
                    scores.append(score)
            row.append((met, len(scores), sum(scores) / len(scores)))
        (bm, n, bs), (hm, _, hs) = row
        ratio = f"{hm / bm:.1f}x" if bm else ("-" if not hm else "from none")
        print(f"| `{persona.name}` | {bm}/{n} ({bs:.2f}) | {hm}/{n} ({hs:.2f}) | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
