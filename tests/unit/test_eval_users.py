"""Several simulated users on one server (`clawrl eval --users`) against a scripted server: each
user measured on their own line of versions with their own key, paced per line; the users file
eval writes; the two-user report."""

from __future__ import annotations

import asyncio
import itertools
import json
import stat
from dataclasses import dataclass, field
from typing import Any

import pytest

from clawrl.config.users import read_users
from clawrl.eval.client import Answer
from clawrl.eval.pacing import expected_samples
from clawrl.eval.personas import PERSONAS, get_persona
from clawrl.eval.run_users import user_entry, user_personas, users_config, users_tasks
from clawrl.eval.scenario import Settings
from clawrl.eval.tasks import load_tasks, split
from clawrl.eval.together import SimUser, run_together
from clawrl.eval.users import line_of, new_key, parse_users, per_step_share, write_users_file
from clawrl.eval.users_report import build_users_report, per_line, users_markdown
from clawrl.version_folder import version_name, version_number
from tests.unit.test_eval_scenario import cancel_and_check_no_user_talks


@dataclass
class ScriptedLines:
    """A server with users, scripted: each line's "trainer" publishes the line's next version once
    `batch` samples of its users are ready. With `per_user` each user has a line of their own
    (`brief/v1`), else one shared line (`v1`). Version N's answers carry 60 - 10 N filler words."""

    batch: int
    per_user: bool
    method: str = "rl"
    hold: dict[str, set[int]] = field(default_factory=dict)  # line -> numbers held: made, never served
    ready: dict[str, int] = field(default_factory=dict)
    made: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # every held version, oldest first
    calls: list[tuple[str, str, bool]] = field(default_factory=list)  # (user, session, side)
    ratings: dict[str, int] = field(default_factory=dict)  # user -> ratings sent
    answers: dict[str, float] = field(default_factory=dict)
    # Without ratings (`judged`): a user's next message makes a sample of the answer before it, and
    # the "trainer" trains one line's full batch every `step_polls` polls of the admin /healthz.
    judged: bool = False
    step_polls: int = 0
    polls: int = 0
    most_pending: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def line(self, user: str) -> str:
        return line_of(user, self.per_user)

    def version(self, user: str) -> str:
        line = self.line(user)
        return version_name(line, self.served.get(line, 0))

    async def health(self) -> dict[str, Any]:
        """The admin key's /healthz: the details, the newest held version of any line."""
        self.polls += 1
        if self.judged and self.polls % self.step_polls == 0:
            due = sorted(line for line, n in self.ready.items() if n >= self.batch)
            if due:
                self.ready[due[0]] -= self.batch
                self.made[due[0]] = self.served[due[0]] = self.made.get(due[0], 0) + 1
        return {
            "samples": {"ready": sum(self.ready.values()), "training": 0},
            "version": self.version("default"),
            "judge": {"status": "ok", "judge": "feedback", "method": self.method},
            "trainer": {"status": "running"},
            "guard": {"last_held": {"version": self.held[-1]} if self.held else None},
        }

    def feedback(self, user: str, rating: int, comment: str | None) -> None:
        self.ratings[user] = self.ratings.get(user, 0) + 1
        line = self.line(user)
        self.ready[line] = self.ready.get(line, 0) + expected_samples(self.method, rating, comment)
        if self.ready[line] >= self.batch:
            self.ready[line] -= self.batch
            self.made[line] = self.made.get(line, 0) + 1
            if self.made[line] in self.hold.get(line, set()):
                self.held.append(version_name(line, self.made[line]))
            else:
                self.served[line] = self.made[line]


@dataclass
class UserClient:
    """EvalClient's interface under one user's key: their own /healthz version, chats, ratings."""

    server: ScriptedLines
    user: str
    unanswered: int = 0

    async def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": "m", "version": self.server.version(self.user)}

    async def version(self) -> str:
        return self.server.version(self.user)

    async def chat(
        self, messages, session_id, *, temperature, max_tokens, side=False, done=False, memory=None
    ) -> Answer:
        await asyncio.sleep(0)
        self.server.calls.append((self.user, session_id, side))
        if self.server.judged and not side and len(messages) > 1:  # the answer before was judged
            line = self.server.line(self.user)
            self.server.ready[line] = self.server.ready.get(line, 0) + 1
            self.server.most_pending = max(self.server.most_pending, sum(self.server.ready.values()))
        version = self.server.version(self.user)
        answer = next((a for q, a in self.server.answers.items() if q in messages[0]["content"]), 0)
        text = "well " * max(0, 60 - 10 * version_number(version)) + f"it is {answer}."
        return Answer(f"chatcmpl-{next(self.server._ids)}", text, version, "stop")

    async def feedback(self, response_id: str, rating: int, comment: str | None) -> None:
        self.server.feedback(self.user, rating, comment)


def _run(server: ScriptedLines, names: list[str], settings: Settings):
    tasks = load_tasks()
    train, held = split(tasks, held_out=3, seed=0)
    server.answers = {t.question: t.answer for t in tasks}
    users = [SimUser(n, get_persona(n), UserClient(server, n), line_of(n, server.per_user)) for n in names]
    return asyncio.run(run_together(server, users, train, held, settings)), held  # type: ignore[arg-type]


def _settings(**kw: Any) -> Settings:
    return Settings(**{"steps": 3, "concurrency": 3, "poll_s": 0.001, "max_wall_s": 30} | kw)


def test_interrupted_users_leave_their_caller_what_was_measured():
    """Cancelled mid-run (what Ctrl-C or SIGTERM does to asyncio.run): the outcomes the caller was
    handed keep each user's points and sessions so far and say they were interrupted (what
    `clawrl eval --users` then reports); no simulated user is left talking to the server."""
    server = ScriptedLines(batch=10**6, per_user=True)  # no version ever comes: the users run on
    tasks = load_tasks()
    train, held = split(tasks, held_out=3, seed=0)
    server.answers = {t.question: t.answer for t in tasks}
    names = ["brief", "stepwise"]
    users = [SimUser(n, get_persona(n), UserClient(server, n), line_of(n, True)) for n in names]
    seen: dict = {}

    async def interrupt() -> None:
        run = asyncio.ensure_future(run_together(server, users, train, held, _settings(), seen))  # type: ignore[arg-type]
        while sum(server.ratings.values()) < 6:  # both measured at v0, then some sessions rated
            await asyncio.sleep(0.001)
        await cancel_and_check_no_user_talks(run, lambda: len(server.calls))

    asyncio.run(interrupt())
    assert list(seen) == names
    for outcome in seen.values():
        assert outcome.stopped == "interrupted" and [p.version for p in outcome.points] == ["v0"]
        assert outcome.wall_s > 0
    assert sum(o.answers for o in seen.values()) >= 6 and any(o.sessions for o in seen.values())


def test_each_user_is_measured_on_their_own_adapters_versions_with_their_own_key():
    server = ScriptedLines(batch=2, per_user=True)
    outcomes, held = _run(server, ["brief", "stepwise"], _settings(samples_per_step=2))
    for name in ("brief", "stepwise"):
        o = outcomes[name]
        assert [p.version for p in o.points] == ["v0", f"{name}/v1", f"{name}/v2", f"{name}/v3"]
        assert [p.step for p in o.points] == [0, 1, 2, 3] and o.stopped == "done" and not o.held
        assert all(p.answer_versions == [p.version] for p in o.points)
        # paced on their own line: one step's worth of ratings per version, none once done
        assert server.ratings[name] == 3 * 2 and o.answers >= 6
        evals = [c for c in server.calls if c[2] and c[0] == name]
        assert len(evals) == 4 * len(held)
    # each scored by their own persona on 63 - 10 N words: brief's credit rises as they shrink;
    # stepwise's falls (no worked step: half the score at most; length credit 0 at 15 words, 1 at 60)
    brief = [p.score for p in outcomes["brief"].points]
    assert brief == pytest.approx([1 - (63 - 10 * n - 30) / 90 for n in range(4)])
    stepwise = [p.score for p in outcomes["stepwise"].points]
    assert stepwise == pytest.approx([min(1.0, (48 - 10 * n) / 45) / 2 for n in range(4)])
    assert not any(c[0] not in ("brief", "stepwise") for c in server.calls)


def test_a_shared_policy_is_one_line_and_each_user_paces_to_their_share_of_its_steps():
    server = ScriptedLines(batch=4, per_user=False)
    outcomes, _ = _run(server, ["brief", "stepwise"], _settings(samples_per_step=4))
    for name in ("brief", "stepwise"):
        assert [p.version for p in outcomes[name].points] == ["v0", "v1", "v2", "v3"]
        assert outcomes[name].stopped == "done"
        assert server.ratings[name] == 3 * 2  # half of each 4-sample step
    assert server.made == {"default": 3}


def test_a_hold_counts_for_its_own_line_only():
    server = ScriptedLines(batch=2, per_user=True, hold={"brief": {2}})
    outcomes, _ = _run(server, ["brief", "stepwise"], _settings(samples_per_step=2, stall_s=60))
    assert [p.version for p in outcomes["brief"].points] == ["v0", "brief/v1", "brief/v3"]
    assert outcomes["brief"].held == ["brief/v2"] and outcomes["brief"].stopped == "done"
    assert [p.version for p in outcomes["stepwise"].points][-1] == "stepwise/v3"
    assert outcomes["stepwise"].held == []


def test_no_new_version_stops_every_user_at_the_deadline():
    server = ScriptedLines(batch=10**6, per_user=True)
    settings = _settings(steps=2, samples_per_step=2, max_wall_s=0.3, stall_s=0.05)
    outcomes, _ = _run(server, ["brief", "stepwise"], settings)
    assert all(o.stopped == "timeout" and [p.step for p in o.points] == [0] for o in outcomes.values())


def test_without_ratings_every_user_holds_while_some_line_has_a_full_batch():
    """The users' next messages wait while the samples pending could fill a batch on some line
    (2 lines x (3 - 1) + 1 = 5), until a version is made: the trainer gets the machine. Unheld,
    they would write on for every poll the trainer takes."""
    server = ScriptedLines(batch=3, per_user=True, judged=True, step_polls=20)
    settings = _settings(samples_per_step=3, feedback=False, stall_s=60)
    outcomes, _ = _run(server, ["brief", "stepwise"], settings)
    for name in ("brief", "stepwise"):
        assert [p.version for p in outcomes[name].points][-1] == f"{name}/v3"
    # The hold's threshold (5), plus what the users send between two polls (scripted answers come at
    # once: 18 here); unheld, 8,063 samples were pending by the end.
    assert server.most_pending <= 60, server.most_pending


def test_users_are_named_personas_once_each():
    known = list(PERSONAS)
    assert parse_users(" brief, stepwise ", known) == ["brief", "stepwise"]
    with pytest.raises(ValueError, match="unknown persona wizard"):
        parse_users("brief,wizard", known)
    with pytest.raises(ValueError, match="twice"):
        parse_users("brief,brief", known)
    with pytest.raises(ValueError, match="names no persona"):
        parse_users(" , ", known)
    assert parse_users("brief,mine.toml,dir/x", known) == ["brief", "mine.toml", "dir/x"]  # files too


def test_users_from_persona_files_are_named_after_their_personas(tmp_path):
    (tmp_path / "copy.toml").write_bytes(PERSONAS["brief"].read_bytes())
    with pytest.raises(ValueError, match="two personas are named alike"):
        user_personas(["brief", str(tmp_path / "copy.toml")], max_turns=3)
    (tmp_path / "terse.toml").write_text(
        PERSONAS["brief"].read_text().replace('name = "brief"', 'name = "terse"')
    )
    personas = user_personas(["stepwise", str(tmp_path / "terse.toml")], max_turns=2)
    assert list(personas) == ["stepwise", "terse"] and personas["terse"].max_turns == 2
    assert len(users_tasks(personas, None)) == 48 and users_tasks(personas, "math") == personas["terse"].tasks


def test_the_users_file_is_private_and_one_the_server_accepts(tmp_path):
    keys = {"brief": new_key("brief"), "stepwise": new_key("stepwise")}
    assert len({*keys.values(), new_key("brief")}) == 3
    path = write_users_file(tmp_path / "run", keys)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == keys
    assert read_users(path, admin_key="sk-admin") == {keys["brief"]: "brief", keys["stepwise"]: "stepwise"}


def test_pacing_shares_a_line_between_its_users():
    assert per_step_share(8, 1) == 8 and per_step_share(8, 2) == 4 and per_step_share(1, 2) == 1
    assert per_step_share(None, 2) is None
    assert line_of("brief", per_user=True) == "brief" and line_of("brief", per_user=False) == "default"


def _report(per_user: bool) -> dict[str, Any]:
    server = ScriptedLines(batch=2, per_user=per_user)
    settings = _settings(steps=2, samples_per_step=2)
    outcomes, held = _run(server, ["brief", "stepwise"], settings)
    entries = {n: user_entry(o, n, line_of(n, per_user)) for n, o in outcomes.items()}
    adapters = "per_user" if per_user else "shared"
    config = {"method": "rl"}
    return build_users_report(
        entries, "rl", adapters, settings, [t.id for t in held], "clawrl eval", config, None
    )


def test_the_report_has_each_users_curve_on_their_own_versions():
    report = _report(per_user=True)
    assert json.loads(json.dumps(report)) == report
    assert (
        report["adapters"] == "per_user"
        and report["method"] == "rl"
        and list(report["users"])
        == [
            "brief",
            "stepwise",
        ]
    )
    brief, stepwise = report["users"]["brief"], report["users"]["stepwise"]
    assert brief["versions"] == ["v0", "brief/v1", "brief/v2"] and brief["line"] == "brief"
    assert stepwise["versions"] == ["v0", "stepwise/v1", "stepwise/v2"] and stepwise["persona"] == "stepwise"
    text = users_markdown(report)
    assert "| step | brief | stepwise |" in text
    for step in range(3):
        b, s = brief["scores"][step], stepwise["scores"][step]
        assert (
            f"| {step} | {b:.3f} ({brief['versions'][step]}) | {s:.3f} ({stepwise['versions'][step]}) |"
            in text
        )
    assert f"| brief | brief | {brief['scores'][2] - brief['scores'][0]:+.3f} |" in text
    assert "an adapter per user" in text
    assert list(per_line(report)["methods"]) == ["brief", "stepwise"]


def test_a_shared_report_shows_one_line_for_both_users():
    report = _report(per_user=False)
    assert (
        report["users"]["brief"]["versions"] == report["users"]["stepwise"]["versions"] == ["v0", "v1", "v2"]
    )
    assert list(per_line(report)["methods"]) == ["brief, stepwise"]
    assert "one shared policy" in users_markdown(report)


def test_a_user_whose_v0_meets_every_check_has_nothing_to_learn():
    report = _report(per_user=True)
    brief = report["users"]["brief"]
    ones = [1.0] * len(brief["task_scores"][0])
    brief |= {"task_scores": [ones, *brief["task_scores"][1:]], "scores": [1.0, *brief["scores"][1:]]}
    report["users"]["brief"]["persona_file"] = {"path": "/p/brief.toml", "sha256": "ab" * 32, "tasks": "math"}
    text = users_markdown(report)
    assert "| brief | brief | nothing to learn (v0 meets every check) |" in text
    assert f"- `brief`'s persona file: `/p/brief.toml` (sha256 `{'ab' * 32}`)" in text


@pytest.mark.parametrize(
    ("adapters", "line"), [("auto", "per_user"), ("per_user", "per_user"), ("shared", "shared")]
)
def test_the_served_config_has_the_users_file_an_admin_key_and_a_run_folder_per_adapters(
    tmp_path, adapters, line
):
    from clawrl.config import load_config
    from clawrl.eval.commands import EVAL_CONFIG

    config = load_config(EVAL_CONFIG, {"train": {"adapters": adapters}})
    keys = {"brief": new_key("brief"), "stepwise": new_key("stepwise")}
    cfg = users_config(config, "combine", keys, tmp_path / "runs")
    assert cfg.run_dir == tmp_path / "runs" / f"combine-{line}" and cfg.method == "combine"
    assert cfg.per_user_adapters == (line == "per_user")
    admin = cfg.server.api_key.get_secret_value()
    assert read_users(cfg.server.users, admin) == {k: n for n, k in keys.items()}  # the server accepts it
    (cfg.run_dir / "clawrl.db").write_bytes(b"")
    with pytest.raises(ValueError, match="holds a run already"):
        users_config(config, "combine", keys, tmp_path / "runs")
