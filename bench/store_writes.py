"""Where the one database stops: requests per second one gateway's SQLite store holds, with the
judge's writes and a trainer's claims, against a plain INSERT loop in the same file.

Each request writes what the server writes for it, through the server's own path (the real
`Store` behind the real `StoreWriter`, its one store thread, from an asyncio loop), one transaction
each as the server makes them:

  1. collect, at the request: the session upserted and the previous turn's next state set;
  2. collect, at the answer: the turn (prompt and response IDs, logprobs, messages);
  3. judge: the previous turn's judgment (`--votes` votes) and its `rl` sample, in one transaction.

Meanwhile a trainer in another process, with its own connection (as `clawrl train` has), every
`--train-every-s` reads up to `--batch` ready samples, claims them and publishes a version marking
them trained (far more often than a real step, which takes seconds to minutes).

Phases, in one run folder, in this order:
  baseline   a plain INSERT loop of one 100-byte row per transaction (same file, WAL, synchronous
             NORMAL), as fast as one connection goes; then of one row of a request's bytes;
  direct     the same writes called on the store from one thread, round-robin over the sessions
             (no event loop, no store thread): what the store itself holds;
  ceiling    closed loop: `--sessions` concurrent sessions each sending its next request as soon
             as the last one's writes landed; requests per second is the ceiling;
  rates      open loop at each of `--rates` requests per second (up to 1.5x the ceiling):
             requests started on schedule, the latency from a request's start to its last write
             landed (p50, p99), and whether the store kept up (the rate asked, p99 under a second);
  baseline   again, so drift on a shared machine shows.

    .venv/bin/python bench/store_writes.py                          # 8,192-token prompts
    .venv/bin/python bench/store_writes.py --prompt-tokens 32768 --rates 20,40,80
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing as mp
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clawrl.store.db import Store  # noqa: E402
from clawrl.store.rows import dumps  # noqa: E402
from clawrl.store.writer import StoreWriter  # noqa: E402
from clawrl.types import Judgment, Sample, Turn, Version, Vote  # noqa: E402

CHARS_PER_TOKEN = 4  # the messages' text beside their token IDs


def plain_inserts(db: Path, seconds: float, size: int = 100) -> float:
    """Commits per second of a one-row INSERT loop (`size` bytes a row) in the same file, with the
    store's pragmas."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS bench_plain (id INTEGER PRIMARY KEY, at REAL, payload TEXT)")
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO bench_plain (at, payload) VALUES (?, ?)", (time.time(), "x" * size))
        conn.execute("COMMIT")
        n += 1
    conn.close()
    return n / elapsed


@dataclasses.dataclass
class Shapes:
    """One request's payload, built once and copied with fresh ids (the bench times the store, not
    the building of lists)."""

    turn: Turn
    votes: list[Vote]

    @classmethod
    def build(cls, prompt_tokens: int, response_tokens: int, votes: int) -> Shapes:
        text = "w" * (prompt_tokens * CHARS_PER_TOKEN)
        turn = Turn(
            id="", session_id="", index=0, turn_type="main",
            messages=[{"role": "system", "content": text[: len(text) // 4]},
                      {"role": "user", "content": text[len(text) // 4 :]}],
            tools=None,
            prompt_ids=[(i * 7919) % 151_000 for i in range(prompt_tokens)],
            response_ids=[(i * 104_729) % 151_000 for i in range(response_tokens)],
            logprobs=[-0.123456789 - i * 1e-6 for i in range(response_tokens)],
            response_text="r" * (response_tokens * CHARS_PER_TOKEN),
            tool_calls=[], finish_reason="stop", versions=["v0"], temperature=1.0,
            created_at=0.0, finished_at=0.0,
        )  # fmt: skip
        vote = Vote(kind="prm", value=1, raw="The answer did what was asked. \\boxed{1}", latency_s=0.8)
        return cls(turn, [vote] * votes)

    def json_ms(self, reps: int = 50) -> float:
        """CPU ms to encode one request's JSON columns as the store does (the turn's and the sample's
        token lists and logprobs, the messages)."""
        t = self.turn
        cpu = time.process_time()
        for _ in range(reps):
            for value in (t.prompt_ids, t.response_ids, t.logprobs) * 2 + (t.messages,):
                dumps(value)
        return (time.process_time() - cpu) * 1000 / reps

    def bytes_per_request(self) -> int:
        t = self.turn  # the turn's token lists and text, and the sample's copy of the token lists
        ids = len(str(t.prompt_ids)) + len(str(t.response_ids)) + len(str(t.logprobs))
        return 2 * ids + sum(len(m["content"]) for m in t.messages) + len(t.response_text)


class Gateway:
    """The server's writes for each request of a session, through the real StoreWriter."""

    def __init__(self, store: Store, writer: StoreWriter, shapes: Shapes) -> None:
        self.store, self.writer, self.shapes = store, writer, shapes
        self.count = 0

    async def request(self, session: str, index: int) -> None:
        now = time.time()
        previous = f"{session}-t{index - 1}" if index else None
        await self.writer.write(self._begin, session, previous, now)
        turn = dataclasses.replace(
            self.shapes.turn, id=f"{session}-t{index}", session_id=session, index=index,
            created_at=now, finished_at=time.time(),
        )  # fmt: skip
        await self.writer.write(self.store.insert_turn, turn)
        if previous is not None:  # the judge scores the previous turn once its next state is in
            await self.writer.write(self.store.insert_judgment, *self._judged(previous))
        self.count += 1

    def direct(self, session: str, index: int) -> None:
        """The same writes called on the store from this thread: no event loop, no store thread."""
        now = time.time()
        previous = f"{session}-t{index - 1}" if index else None
        self._begin(session, previous, now)
        turn = dataclasses.replace(
            self.shapes.turn, id=f"{session}-t{index}", session_id=session, index=index,
            created_at=now, finished_at=time.time(),
        )  # fmt: skip
        self.store.insert_turn(turn)
        if previous is not None:
            self.store.insert_judgment(*self._judged(previous))
        self.count += 1

    def _begin(self, session: str, previous: str | None, now: float) -> None:
        self.store.upsert_session(session, "header", now)
        if previous is not None:
            self.store.set_next_state(previous, [{"role": "user", "content": "thanks, next"}], now)

    def _judged(self, turn_id: str) -> tuple[Judgment, list[Sample]]:
        t = self.shapes.turn
        votes = self.shapes.votes
        judgment = Judgment(turn_id=turn_id, judge="openai:judge", votes=votes, score=1, hint=None)
        sample = Sample(turn_id, "rl", t.prompt_ids, t.response_ids, t.logprobs, "v0", 1.0, reward=1.0)
        return judgment, [sample]


def trainer(db: str, batch: int, every_s: float, stop: Any, out: Any) -> None:
    """A trainer's store traffic: read ready samples, claim them, publish a version marking them trained."""
    claimed = versions = 0
    with Store.open(db) as store:
        out.put("ready")
        while not stop.wait(every_s):
            ready = [s.id for s in store.ready_samples(limit=batch) if s.id is not None]
            if not ready:
                continue
            ids = store.claim_samples(ready)
            versions += 1
            store.publish_version(Version(f"v{versions}", versions, f"checkpoints/v{versions}"), ids)
            claimed += len(ids)
    out.put((claimed, versions))


def direct_loop(gateway: Gateway, sessions: int, seconds: float) -> tuple[float, float]:
    """Requests per second, and CPU ms a request, with the writes called directly, round-robin over
    `sessions` sessions: what the store itself holds without the server's thread hand-offs."""
    indices, n = [0] * sessions, 0
    cpu, start = time.process_time(), time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        s = n % sessions
        gateway.direct(f"d-s{s}", indices[s])
        indices[s] += 1
        n += 1
    return n / elapsed, (time.process_time() - cpu) * 1000 / n


async def closed_loop(gateway: Gateway, sessions: int, seconds: float, start_index: int) -> float:
    """Requests per second with `sessions` sessions each sending its next request at once."""
    deadline = time.perf_counter() + seconds
    before = gateway.count

    async def session(n: int) -> None:
        index = start_index
        while time.perf_counter() < deadline:
            await gateway.request(f"c{start_index}-s{n}", index)
            index += 1

    start = time.perf_counter()
    await asyncio.gather(*(session(n) for n in range(sessions)))
    return (gateway.count - before) / (time.perf_counter() - start)


async def open_loop(gateway: Gateway, rate: float, seconds: float, sessions: int) -> dict[str, float]:
    """Requests started at `rate` per second, round-robin over `sessions` sessions; latencies."""
    latencies: list[float] = []
    locks = [asyncio.Lock() for _ in range(sessions)]  # a session's requests follow one another
    indices = [0] * sessions
    tag = f"r{rate:g}"

    async def one(n: int, at: float) -> None:
        async with locks[n % sessions]:
            s = n % sessions
            await gateway.request(f"{tag}-s{s}", indices[s])
            indices[s] += 1
        latencies.append(time.perf_counter() - at)

    tasks, start, n = [], time.perf_counter(), 0
    while (at := start + n / rate) < start + seconds:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.create_task(one(n, at)))
        n += 1
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "sent": n,
        "achieved": n / wall,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


Rates = list[tuple[float, dict[str, float]]]


Result = tuple[tuple[float, float], float, float, Rates]


async def drive(args: argparse.Namespace, store: Store, shapes: Shapes) -> Result:
    """The direct loop's (requests/s, CPU ms), the ceiling (requests/s), this process's CPU
    milliseconds a request at it, and the rates."""
    writer = StoreWriter(retry_every_s=0.5, max_pending=10_000)
    writer.start()
    gateway = Gateway(store, writer, shapes)
    direct = direct_loop(gateway, args.sessions, args.seconds)
    gateway.count = 0
    try:
        cpu = time.process_time()
        ceiling = await closed_loop(gateway, args.sessions, args.seconds, 0)
        cpu_ms = (time.process_time() - cpu) * 1000 / gateway.count
        # A rate well above the ceiling would only queue writes for minutes: not tried.
        tried = [r for r in args.rates if r <= 1.5 * ceiling]
        rates = [(r, await open_loop(gateway, r, args.seconds, args.sessions)) for r in tried]
    finally:
        await writer.stop()
    return direct, ceiling, cpu_ms, rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    ap.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--response-tokens", type=int, default=512)
    ap.add_argument("--votes", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256, help="samples a trainer claims at most at a time")
    ap.add_argument("--train-every-s", type=float, default=1.0)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[20, 40, 80, 160])
    ap.add_argument("--dir", type=Path, default=None, help="where the run folder goes (a temporary one)")
    args = ap.parse_args()
    shapes = Shapes.build(args.prompt_tokens, args.response_tokens, args.votes)
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-store-", dir=args.dir) as d:
        db = Path(d) / "clawrl.db"
        store = Store.open(db)
        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=trainer, args=(str(db), args.batch, args.train_every_s, stop, out))
        proc.start()  # first: its start is not timed; with no sample ready it only polls
        try:
            assert out.get(timeout=300) == "ready"
            before = plain_inserts(db, args.seconds)
            sized = plain_inserts(db, args.seconds, shapes.bytes_per_request())
            direct, ceiling, cpu_ms, rates = asyncio.run(drive(args, store, shapes))
        finally:
            stop.set()
            claimed, versions = out.get(timeout=60)
            proc.join()
        after = plain_inserts(db, args.seconds)
        size_mb = sum(f.stat().st_size for f in Path(d).iterdir()) / 2**20
        store.close()
    mb = shapes.bytes_per_request() / 2**20
    base = (before + after) / 2
    print(
        f"\nper request: {args.prompt_tokens:,}-token prompt, {args.response_tokens}-token answer, "
        f"{args.votes} votes, 1 sample: 4 transactions (2 for a session's first), ~{mb:.2f} MB"
    )
    print(f"baseline, a 100-byte INSERT a transaction: {before:,.0f} commits/s before, {after:,.0f} after")
    print(f"baseline, one request's bytes in one INSERT a transaction: {sized:,.1f} commits/s")
    print(
        f"ceiling ({args.sessions} sessions, closed loop): {ceiling:,.1f} requests/s "
        f"= {4 * ceiling:,.0f} transactions/s ({4 * ceiling / base:.3f}x the 100-byte commits; "
        f"requests {ceiling / sized:.2f}x the request-sized commits), {ceiling * mb:,.1f} MB/s; "
        f"{cpu_ms:.1f} CPU ms a request in the gateway process, which had {ceiling * cpu_ms / 10:.0f}% of a "
        f"core meanwhile (a core of its own: about {1000 / cpu_ms:,.0f} requests/s, less disk waits)"
    )
    json_ms = shapes.json_ms()
    print(f"of which encoding the JSON columns: {json_ms:.1f} CPU ms ({json_ms / cpu_ms:.0%})")
    print(
        f"direct (the writes called from one thread, no event loop or store thread): {direct[0]:,.1f} "
        f"requests/s ({direct[0] / ceiling:.2f}x the ceiling), {direct[1]:.1f} CPU ms a request"
    )
    for rate in (r for r in args.rates if r not in dict(rates)):
        print(f"at {rate:g} requests/s: not tried, above 1.5x the ceiling")
    for rate, r in rates:
        kept = r["achieved"] >= 0.95 * rate and r["p99"] < 1.0
        print(
            f"at {rate:g} requests/s ({rate / ceiling:.2f}x the ceiling): achieved {r['achieved']:.1f}/s, "
            f"writes landed p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms: "
            f"{'kept up' if kept else 'did NOT keep up'}"
        )
    print(f"trainer: {versions} versions published, {claimed} samples claimed; store {size_mb:,.0f} MB")


if __name__ == "__main__":
    main()
