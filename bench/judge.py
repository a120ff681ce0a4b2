"""How often each judge gives the right sign on the labelled set (clawrl/judge/cases.jsonl).

Run: .venv/bin/python bench/judge.py [--judges likelihood-base,likelihood-policy,generate]
                                     [--policy ADAPTER_DIR] [--generate-limit 24] [--votes 3]
                                     [--cases clawrl/judge/heldout.jsonl]

`--cases FILE` reads another set of the same format instead of cases.jsonl; the held-out set
(clawrl/judge/heldout.jsonl) checks the judge on phrasings it was never tuned on, and the
change-request set (clawrl/judge/requests.jsonl) on polite requests to change an answer, new
questions, thanks and mixed replies (docs/recording-and-judging.md).

One local engine on the embedded model (or --model), in this process; each case becomes the
turn a judge reads, and each judge casts `--votes` votes on it as the server would:

  likelihood-base    the default: label likelihoods on the frozen base weights, calibrated,
                     one prompt variant per vote (clawrl/judge/likelihood.py)
  likelihood-policy  the same on the served policy: `--policy` (a LoRA version folder of a
                     run, e.g. RUN/checkpoints/v3) merged in; without it the policy is the base
  generate           today's generation judge (prm.txt, `\\boxed{}` parsed), on the first
                     `--generate-limit` cases taken round-robin by category (it takes minutes
                     a vote on a CPU)

Printed per judge: right sign overall and per category, the four classes that matter most
(corrections and complaints must read -1, thanks +1, a neutral follow-up 0; for neutral also how
many were not read -1, i.e. made no wrong hint), the confusion matrix (label x the
majority, a turn whose every vote failed counted apart), failed votes, and the mean latency of
one vote. Ratios are against the labels, measured in the same run; `--out FILE.json` keeps all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clawrl.chat.template import ChatRenderer  # noqa: E402
from clawrl.config import Config  # noqa: E402
from clawrl.engine.local.build import build_local_engine  # noqa: E402
from clawrl.judge.backends import JudgeCallFailed, LocalJudge  # noqa: E402
from clawrl.judge.cases import CATEGORIES, Case, load_cases  # noqa: E402
from clawrl.judge.likelihood import reply_text  # noqa: E402
from clawrl.judge.prompts import judge_messages, tool_names  # noqa: E402
from clawrl.judge.scorer import LikelihoodJudge  # noqa: E402
from clawrl.judge.votes import majority, prm_vote  # noqa: E402
from clawrl.types import Version, Vote  # noqa: E402

JUDGES = ("likelihood-base", "likelihood-policy", "generate")
CLASSES = ("correction", "complaint", "thanks", "neutral")


def spread(cases: list[Case], limit: int) -> list[Case]:
    """The first `limit` cases taken round-robin over the categories."""
    by: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        by[case.category].append(case)
    out: list[Case] = []
    while len(out) < limit and any(by.values()):
        for category in CATEGORIES:
            if by[category] and len(out) < limit:
                out.append(by[category].pop(0))
    return out


async def likelihood_votes(judge: LikelihoodJudge, case: Case, m: int) -> list[Vote]:
    turn = case.turn()
    reply = reply_text(case.next_state, tool_names(turn))
    votes = []
    for variant in range(m):
        start = time.perf_counter()
        try:
            read = await judge.read(reply, variant)
            raw = json.dumps({"q_bad": read.calibrated[-1], "cue": read.cue, "plain": read.plain})
            votes.append(Vote("prm", read.value, raw=raw, latency_s=time.perf_counter() - start))
        except JudgeCallFailed as exc:
            votes.append(prm_vote(None, time.perf_counter() - start, str(exc)))
    return votes


async def generate_votes(
    judge: LocalJudge, case: Case, m: int, temperature: float, tokens: int
) -> list[Vote]:
    messages = judge_messages("prm", case.turn(), case.next_state)

    async def one() -> Vote:
        start = time.perf_counter()
        try:
            raw = await judge.complete(messages, temperature, tokens)
        except JudgeCallFailed as exc:
            return prm_vote(None, time.perf_counter() - start, str(exc))
        return prm_vote(raw, time.perf_counter() - start)

    return list(await asyncio.gather(*(one() for _ in range(m))))  # the server casts them at once


def without_cues(row: dict) -> dict:
    """The row as the likelihood alone voted, each vote's dissatisfaction cue left out."""
    plain = [Vote("prm", json.loads(v["raw"])["plain"] if v["raw"] else None) for v in row["votes"]]
    votes = [{**v, "value": p.value} for v, p in zip(row["votes"], plain, strict=True)]
    return {**row, "predicted": majority(plain), "votes": votes}


def summary(name: str, rows: list[dict]) -> dict:
    right = [r for r in rows if r["predicted"] == r["label"]]
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        per[r["category"]][0] += r["predicted"] == r["label"]
        per[r["category"]][1] += 1
    confusion = Counter((r["label"], "failed" if r["all_failed"] else r["predicted"]) for r in rows)
    votes = [v for r in rows for v in r["votes"]]
    signed = [r for r in rows if r["label"] != 0 and r["category"] in ("correction", "complaint", "thanks")]
    neutral = [r for r in rows if r["category"] == "neutral"]
    return {
        "judge": name,
        "cases": len(rows),
        "right": len(right),
        "accuracy": len(right) / len(rows) if rows else None,
        "corrections_and_thanks": (sum(r["predicted"] == r["label"] for r in signed), len(signed)),
        "per_category": {c: tuple(per[c]) for c in CATEGORIES if c in per},
        "per_class": {c: tuple(per[c]) for c in CLASSES if c in per},
        "neutral_not_bad": (sum(r["predicted"] != -1 for r in neutral), len(neutral)),
        "confusion": {f"{label}->{pred}": n for (label, pred), n in sorted(confusion.items(), key=str)},
        "votes": len(votes),
        "failed_votes": sum(v["value"] is None for v in votes),
        "vote_latency_s": statistics.mean(v["latency_s"] for v in votes) if votes else None,
    }


def show(s: dict) -> None:
    ct_right, ct_n = s["corrections_and_thanks"]
    print(f"\n## {s['judge']}: {s['right']}/{s['cases']} right sign ({s['accuracy']:.0%})")
    print(
        f"corrections, complaints and thanks: {ct_right}/{ct_n}; "
        f"failed votes {s['failed_votes']}/{s['votes']}; {s['vote_latency_s']:.2f} s a vote"
    )
    print("per category: " + ", ".join(f"{c} {r}/{n}" for c, (r, n) in s["per_category"].items()))
    print("per class: " + ", ".join(f"{c} {r}/{n} ({r / n:.0%})" for c, (r, n) in s["per_class"].items()))
    if s["neutral_not_bad"][1]:
        print("neutral not read -1: {}/{}".format(*s["neutral_not_bad"]))
    print("label -> majority: " + ", ".join(f"{k} {n}" for k, n in s["confusion"].items()))


async def run(args: argparse.Namespace) -> list[dict]:
    config = Config.model_validate(
        {
            "model": {"path": args.model},
            "train": {"enabled": False},
            "collect": {"enabled": False},
            "engine": {"prefix_cache_mb": 0},
        }
    )
    engine, tokenizer = build_local_engine(config)
    await engine.start()
    cases = load_cases(args.cases)
    if args.limit:
        cases = spread(cases, args.limit)
    results = []
    try:
        for name in args.judges:
            if name == "likelihood-policy" and args.policy:
                await engine.serve_version(Version(name="v99", step=99, path=str(args.policy)))
            elif name != "likelihood-policy":
                await engine.serve_version(Version(name="v0", step=0))
            subset = spread(cases, args.generate_limit) if name == "generate" else cases
            rows = []
            for i, case in enumerate(subset):
                if name == "generate":
                    judge = LocalJudge(engine, ChatRenderer(tokenizer))
                    votes = await generate_votes(judge, case, args.votes, args.temperature, args.judge_tokens)
                else:
                    judge = LikelihoodJudge(engine, tokenizer, base=name == "likelihood-base")
                    votes = await likelihood_votes(judge, case, args.votes)
                rows.append(
                    {
                        "id": case.id,
                        "category": case.category,
                        "label": case.label,
                        "predicted": majority(votes),
                        "all_failed": all(v.value is None for v in votes),
                        "votes": [
                            {"value": v.value, "latency_s": v.latency_s, "raw": v.raw, "error": v.error}
                            for v in votes
                        ],
                    }
                )
                print(f"\r{name}: {i + 1}/{len(subset)}", end="", file=sys.stderr, flush=True)
            s = summary(name, rows)
            show(s)
            results.append({**s, "rows": rows})
            if name != "generate":  # the same readings without the cue layer (judge/cues.py)
                alone = summary(f"{name}, likelihood alone (no cues)", [without_cues(r) for r in rows])
                show(alone)
                results.append(alone)
    finally:
        await engine.stop()
        engine.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    p.add_argument("--judges", default="likelihood-base,generate", help=f"comma list of {', '.join(JUDGES)}")
    p.add_argument("--policy", type=Path, default=None, help="a LoRA version folder: the policy judged with")
    p.add_argument("--votes", type=int, default=3)
    p.add_argument("--cases", type=Path, default=None, help="a set in cases.jsonl's format (default: it)")
    p.add_argument("--limit", type=int, default=0, help="only this many cases, round-robin by category")
    p.add_argument("--generate-limit", type=int, default=24)
    p.add_argument(
        "--temperature", type=float, default=0.6, help="the generation judge's (judge.temperature)"
    )
    p.add_argument("--judge-tokens", type=int, default=384, help="the generation judge's judge.max_tokens")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    args.judges = [j.strip() for j in args.judges.split(",") if j.strip()]
    if bad := [j for j in args.judges if j not in JUDGES]:
        p.error(f"unknown judge(s) {bad}; choose from {', '.join(JUDGES)}")
    results = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
