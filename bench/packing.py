"""A training step on an OpenClaw session's turns, each turn alone vs the session in one sequence.

The trainer scores each sample's whole sequence (policy, reference, and the teacher pass of an opd
sample); an agent's turn k+1 resends turn k's prompt and answer, so scoring turns alone recomputes
the shared prefix once per turn. `train.pack_prefixes` (clawrl/train/packing.py) scores a
session's turns in one sequence. This bench takes the main turns of a run folder that served
OpenClaw (or holds a 3-turn OpenClaw conversation itself, as bench/openclaw.py does, on a fresh
server), makes one `rl` sample per turn (rewards +1 / -1 alternating; the behaviour logprobs as
recorded), and times `Trainer.step` on the embedded model with LoRA (clawrl's defaults: KL on),
packed and alone, alternating, after one warm-up step each. Figures: tokens scored per pass
against tokens trained, and the step's time; ratios packed / alone in the same run.

    .venv/bin/python bench/packing.py                       # records a 3-turn OpenClaw session first
    .venv/bin/python bench/packing.py --run-dir RUN_DIR     # the main turns of a run that served OpenClaw
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import start_server

from clawrl.config import Config, TrainConfig
from clawrl.model.load import ensure_embedded
from clawrl.store.db import Store
from clawrl.types import Sample


def samples_of(run_dir: Path) -> list[Sample]:
    """One rl sample per main turn of the run's longest session (rewards alternating)."""
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        main = [t for t in store.turns() if t.turn_type == "main"]
    longest = max({t.session_id for t in main}, key=lambda sid: sum(t.session_id == sid for t in main))
    turns = sorted((t for t in main if t.session_id == longest), key=lambda t: t.created_at)
    return [
        Sample(t.id, "rl", t.prompt_ids, t.response_ids, t.logprobs, "v0", t.temperature,
               reward=1.0 if i % 2 == 0 else -1.0, rope_scaled=t.rope_scaled)
        for i, t in enumerate(turns)
    ]  # fmt: skip


def record_session(tmp: Path) -> Path:
    """A fresh server on the embedded model and a 3-turn OpenClaw conversation with it (bench/openclaw.py)."""
    from openclaw import conversation

    from clawrl.eval.openclaw import install

    server = start_server(tmp / "run", ["--judge.backend", "feedback"], timeout=600)
    try:
        conversation(server, install() / "openclaw", tmp, lean=True, max_tokens=64, temperature=None)
    finally:
        server.stop()
    return tmp / "run"


def measure(samples: list[Sample], rounds: int) -> dict[str, dict[str, float]]:
    from clawrl.train.policy import build_policy

    model = ensure_embedded(Config().cache_dir())
    out: dict[str, dict[str, list[float]]] = {"packed": {}, "alone": {}}
    policies = {}
    for name in out:
        cfg = TrainConfig(pack_prefixes=name == "packed", lr=1e-6)
        policies[name] = build_policy(model, cfg, "cpu")
        policies[name].trainer.step(samples)  # warm-up
    for _ in range(rounds):
        for name, policy in policies.items():
            m = policy.trainer.step(samples)
            for key in ("step_s", "tokens_scored", "tokens"):
                out[name].setdefault(key, []).append(m[key])
    return {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", type=Path, help="a run folder whose main turns are an agent's session")
    ap.add_argument("--rounds", type=int, default=3, help="timed steps of each kind (default 3)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-packing-") as tmp:
        run_dir = args.run_dir or record_session(Path(tmp))
        samples = samples_of(run_dir)
    if len(samples) < 2:
        raise SystemExit(f"{run_dir} has {len(samples)} main turns: a session needs two or more")
    figures = measure(samples, args.rounds)
    p, a = figures["packed"], figures["alone"]
    prompts = [len(s.prompt_ids) for s in samples]
    print(f"\n{len(samples)} turns, prompts {prompts} tokens, {int(a['tokens'])} answer tokens trained; "
          f"the embedded model, LoRA, KL on, median of {args.rounds} steps")  # fmt: skip
    print("| scoring | tokens scored per pass | scored / trained | step | ratio to alone |")
    print("| --- | --- | --- | --- | --- |")
    for name, f in (("each turn alone", a), ("the session in one sequence", p)):
        print(f"| {name} | {int(f['tokens_scored']):,} | {f['tokens_scored'] / f['tokens']:.1f} | "
              f"{f['step_s']:.2f} s | {f['step_s'] / a['step_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
