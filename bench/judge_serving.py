"""What judging costs serving, and how fast it judges.

Run: .venv/bin/python bench/judge_serving.py [--model DIR] [--rounds 3] [--backend local]

Two servers on the same model run side by side: one judges every turn that gets
a next state (`--judge.backend local` by default: the server's own engine, the
judge that competes with serving, in its default mode: label likelihoods, frozen
base weights), the other has `--judge.enabled false`. `--clients` (4) concurrent
clients each hold a 3-turn conversation (every turn after the first gives the one
before a next state, so judging starts during the load). The
servers take turns, round after round, so machine noise hits both alike; the
judging server is frozen (SIGSTOP) while the other one is measured, so its
judge backlog cannot slow the baseline. Judging rate = judgments made during
the judging server's own rounds.

Printed: serving latency (mean, p95) with judging on and off and their ratio
(target: p95 on/off <= 1.2), the turns judged and votes cast (`/healthz`
`judge.votes`) per minute while serving the clients, and the same in the idle
time after the load, until the judge's backlog is done (at most `--idle-s`). (The local judge's
label likelihoods are background work: all of the idle time is theirs, and `--share`
(`engine.background_share`, default the config's 0.15) of the engine's time while served
requests are active.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from common import burst, p95, start_server

from clawrl.launcher import ServerProcess


def judged(server: ServerProcess) -> tuple[int, int]:
    """(turns judged, votes cast) since the server started."""
    judge = server.health()["judge"]
    return judge["judged"], sum(judge["votes"].values())


def run(args: argparse.Namespace, tmp: Path) -> dict:
    base = ["--model", args.model] if args.model else []
    judge = [
        "--judge.backend",
        args.backend,
        "--judge.votes",
        str(args.votes),
        "--judge.max-tokens",
        str(args.judge_tokens),
        "--method",
        args.method,
    ]
    if args.share is not None:
        judge += ["--engine.background-share", str(args.share)]
    on = start_server(tmp / "on", base + judge)
    off = start_server(tmp / "off", base + ["--judge.enabled", "false"])
    lat: dict[str, list[float]] = {"on": [], "off": []}
    busy = 0.0
    try:
        for server in (on, off):
            asyncio.run(burst(server, 2, 1, 2))
        start_judged = judged(on)
        for r in range(args.rounds):
            order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
            for name, server in order:
                t0 = time.perf_counter()
                if name == "off":  # freeze the judging server: its backlog must not load the other one
                    os.kill(on.proc.pid, signal.SIGSTOP)
                try:
                    lat[name] += asyncio.run(burst(server, args.clients, 3, args.max_tokens))
                finally:
                    os.kill(on.proc.pid, signal.SIGCONT)
                busy += (time.perf_counter() - t0) if name == "on" else 0.0
        idle_start = judged(on)
        during = [a - b for a, b in zip(idle_start, start_judged, strict=True)]
        # No load: the judge has the machine, until its backlog is judged or --idle-s is up.
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.idle_s and on.health()["judge"]["queued"] > 0:
            time.sleep(1.0)
        idle_s = time.perf_counter() - t0
        idle = [a - b for a, b in zip(judged(on), idle_start, strict=True)]
        queued = on.health()["judge"]["queued"]
    finally:
        on.stop()
        off.stop()
    stats = {k: {"mean_s": statistics.mean(v), "p95_s": p95(v), "n": len(v)} for k, v in lat.items()}
    return {
        "latency": stats,
        "judged_under_load": during,
        "load_minutes": busy / 60,
        "judged_idle": idle,
        "idle_minutes": idle_s / 60,
        "queued_at_end": queued,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: the embedded model)")
    p.add_argument("--backend", default="local", choices=["local"], help="judge backend under test")
    p.add_argument("--method", default="combine")
    p.add_argument("--votes", type=int, default=3)
    p.add_argument("--judge-tokens", type=int, default=96, help="judge.max_tokens")
    p.add_argument("--share", type=float, help="engine.background_share of the judging server")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4, help="concurrent conversations in each round")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per served answer")
    p.add_argument(
        "--idle-s", type=float, default=120.0, help="idle time after the load, for the judging rate"
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = run(args, Path(d))
    lat = res["latency"]
    print(
        f"judging: backend {args.backend}, method {args.method}, {args.votes} votes, "
        f"{args.judge_tokens} tokens per judge reply, share {args.share or 'default'}; "
        f"load: {args.clients} clients x 3 turns x "
        f"{args.rounds} rounds, {args.max_tokens} tokens per answer"
    )
    for k in ("off", "on"):
        mean, high = lat[k]["mean_s"] * 1000, lat[k]["p95_s"] * 1000
        print(f"  judge {k:3}: serving mean {mean:7.1f} ms   p95 {high:7.1f} ms   ({lat[k]['n']} requests)")
    ratio = lat["on"]["p95_s"] / lat["off"]["p95_s"]
    verdict = "PASS" if ratio <= 1.2 else "MISS"
    print(
        f"  serving p95 on/off: {ratio:.3f} (target <= 1.2): {verdict};  mean on/off: "
        f"{lat['on']['mean_s'] / lat['off']['mean_s']:.3f}"
    )
    (turns, votes), (idle_turns, idle_votes) = res["judged_under_load"], res["judged_idle"]
    busy, idle = res["load_minutes"], res["idle_minutes"]
    print(
        f"  under load ({args.clients} streams): {turns} turns judged, {votes} votes in {busy:.1f} min "
        f"= {votes / busy:.1f} votes/min; idle: {idle_turns} turns, {idle_votes} votes in {idle:.1f} min "
        f"= {idle_votes / idle:.1f} votes/min ({res['queued_at_end']} turns still queued)"
    )


if __name__ == "__main__":
    main()
