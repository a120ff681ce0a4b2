"""Load on the embedded model: 64 streaming clients plus 16 that hang up mid-stream.

Baseline: one client alone on the same server, in the same run. Reports time to first token
p50/p99 under load (and as a ratio to the lone client's), failures among the clients that stay,
turns recorded vs requests sent, and the server's memory before, at the peak and after.

    .venv/bin/python bench/load.py                # 64 + 16 clients, 16 tokens each
    .venv/bin/python bench/load.py --staying 32 --leaving 8 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from pathlib import Path

from common import rss_mb, start_server

from clawrl.eval.load import run_load
from clawrl.launcher import ServerProcess
from clawrl.store.db import Store


def turn_count(server: ServerProcess) -> int:
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return sum(1 for _ in store.turns())


def idle(server: ServerProcess) -> None:
    while (e := server.health()["engine"])["active"] or e["waiting"]:
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--staying", type=int, default=64)
    ap.add_argument("--leaving", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-load-") as d:
        server = start_server(Path(d) / "run", ["--judge.enabled", "false"], timeout=600)
        try:
            url = server.url + "/v1"
            alone = [asyncio.run(run_load(url, 1, 0, args.max_tokens)).ttft_s[0] for _ in range(3)]
            base = sorted(alone)[1]
            idle(server)
            start_mb, sent_before = rss_mb(server.proc.pid), turn_count(server)
            peak = [start_mb]
            stop = threading.Event()
            watcher = threading.Thread(target=lambda: _watch(server.proc.pid, peak, stop), daemon=True)
            watcher.start()
            result = asyncio.run(run_load(url, args.staying, args.leaving, args.max_tokens))
            idle(server)
            stop.set()
            watcher.join()
            expected, deadline = args.staying + args.leaving, time.monotonic() + 60
            while turn_count(server) - sent_before < expected and time.monotonic() < deadline:
                time.sleep(0.2)  # the writer thread records the last cut-off turns
            recorded = turn_count(server) - sent_before
            end_mb = rss_mb(server.proc.pid)
        finally:
            server.stop()
    p50, p99 = result.percentile(50), result.percentile(99)
    print(f"\n{args.staying} streaming + {args.leaving} hanging up, {args.max_tokens} tokens each")
    print(f"lone client TTFT (median of 3): {base:.2f} s")
    print(
        f"TTFT under load: p50 {p50:.2f} s ({p50 / base:.1f}x lone), p99 {p99:.2f} s ({p99 / base:.1f}x lone)"
    )
    print(f"failed among staying: {len(result.failures)}; completed {result.completed}/{args.staying}")
    print(f"hung up as planned: {result.left}/{args.leaving}; wall {result.wall_s:.1f} s")
    print(f"turns recorded: {recorded} of {args.staying + args.leaving} requests sent")
    print(
        f"server RSS: {start_mb:.0f} MB before, {max(peak):.0f} MB peak, {end_mb:.0f} MB after "
        f"({end_mb / start_mb:.3f}x before)"
    )
    for failure in result.failures[:5]:
        print("  ", failure)


def _watch(pid: int, peak: list[float], stop: threading.Event) -> None:
    while not stop.wait(0.2):
        peak.append(rss_mb(pid))


if __name__ == "__main__":
    main()
