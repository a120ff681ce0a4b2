"""`clawrl eval` end to end on the tiny random model, then `clawrl report` on its run folder.

A real `clawrl serve` with its trainer process, simulated users over HTTP, explicit
ratings, two published versions; about half a minute on a 2-core CPU. The tiny model
learns nothing useful, so this checks the plumbing and the numbers' bookkeeping: one
score per measured version, eval turns never trained on, the report files valid.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from clawrl.store.db import Store
from tests.conftest import CLAWRL, ROOT
from tests.timing import limit

pytestmark = pytest.mark.slow
PNG = b"\x89PNG\r\n\x1a\n"


def clawrl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    command = [*CLAWRL, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=limit(timeout), cwd=ROOT)


@pytest.fixture(scope="module")
def eval_out(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("eval") / "out"
    done = clawrl(
        "eval", "--model", str(tiny_model_dir), "--persona", "brief", "--method", "rl",
        "--steps", "2", "--held-out", "2", "--max-tokens", "24", "--out", str(out),
        # --stall-s: how long the users wait for a version before they go on (only when one does not
        # come: a served version lets them go at once). A trainer slower than it lets the users' extra
        # samples make an extra version, measured in the place of the one before: on a loaded machine
        # (load 9 on 2 cores) a step took longer than 45 s and v1's answers were v2's.
        "--train.batch-size", "2", "--judge.backend", "feedback", "--stall-s", f"{limit(60):g}",
        # the tiny model trains in milliseconds: look for samples and versions often, and do
        # not nice the trainer, which would starve behind the busy server on 2 cores
        "--train.poll-s", "0.2", "--train.swap-poll-s", "0.2", "--train.nice", "0",
        # a tiny random model has no general skill for the canary gate to guard
        "--guard.enabled", "false",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_eval_reports_one_score_per_step(eval_out: Path):
    report = json.loads((eval_out / "report.json").read_text())
    rl = report["methods"]["rl"]
    assert list(report["methods"]) == ["rl"]
    assert len(rl["scores"]) == 3 and all(0.0 <= s <= 1.0 for s in rl["scores"])
    assert rl["versions"] == ["v0", "v1", "v2"] and rl["steps"] == [0, 1, 2]
    assert rl["answer_versions"] == [["v0"], ["v1"], ["v2"]]
    assert [len(scores) for scores in rl["task_scores"]] == [2, 2, 2]
    assert rl["stopped"] == "done" and rl["answers"] >= 4 and rl["wall_s"] > 0
    assert report["persona"] == "brief" and report["judge"] == "feedback" and report["feedback"] is True
    assert "POST /v1/feedback" in report["signal"]
    assert report["config"]["train"]["batch_size"] == 2 and report["config"]["judge"]["backend"] == "feedback"
    assert report["command"].startswith("clawrl eval --model")
    table = (eval_out / "report.md").read_text()
    for step, (score, version) in enumerate(zip(rl["scores"], rl["versions"], strict=True)):
        assert f"| {step} | {score:.3f} ({version}) |" in table
    assert (eval_out / "scores.png").read_bytes().startswith(PNG)
    run_dir = Path(rl["run_dir"])
    assert json.loads((run_dir / "report.json").read_text()) == report


def test_eval_trains_on_rated_conversations_and_never_on_eval_turns(eval_out: Path):
    with Store.open(eval_out / "runs" / "rl" / "clawrl.db", readonly=True) as store:
        assert [v.name for v in store.versions()] == ["v0", "v1", "v2"]
        assert all(v.metrics["samples"] == 2 for v in store.versions()[1:])
        turns = list(store.turns())
        evals = [t for t in turns if t.session_id.startswith("eval-")]
        assert len(evals) == 3 * 2 and all(t.turn_type == "side" and t.temperature == 0.0 for t in evals)
        training = [t for t in turns if t.session_id.startswith("train-rl-")]
        assert training and all(t.turn_type == "main" for t in training)
        rated = [t for t in training if store.latest_feedback(t.id) is not None]
        assert len(rated) >= 4 and all(store.latest_feedback(t.id).rating in (1, -1) for t in rated)
        assert store.count_samples(status="trained") == 4
        assert not any(store.latest_judgment(t.id) for t in evals)


def test_report_plots_the_run(eval_out: Path, tmp_path: Path):
    run_dir = eval_out / "runs" / "rl"
    done = clawrl("report", "--run-dir", str(run_dir), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rl = json.loads((eval_out / "report.json").read_text())["methods"]["rl"]
    scores = ", ".join(f"{v} {s:.3f}" for v, s in zip(rl["versions"], rl["scores"], strict=True))
    assert "method rl: 2 training steps, 3 versions" in done.stdout
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        for v in store.versions()[1:]:
            assert (
                f"{v.name:<5} step {v.step:<3} samples 2  mean reward {v.metrics['mean_reward']:+.2f}"
                in done.stdout
            )
    assert f"eval scores: {scores}" in done.stdout
    assert (tmp_path / "training.png").read_bytes().startswith(PNG)
    assert not (run_dir / "training.png").exists()  # --out, not the run folder


def test_eval_stopped_by_sigterm_reports_what_it_measured_and_stops_its_server(tmp_path, tiny_model_dir):
    """A long eval sent SIGTERM once v0 is measured (a job runner's time limit, `kill`): it exits 143
    with report.json written from v0's point, marked interrupted, and leaves no server running."""
    out = tmp_path / "out"
    command = [*CLAWRL, "eval", "--model", str(tiny_model_dir), "--persona", "brief"]
    command += ["--method", "rl", "--steps", "50", "--held-out", "2", "--max-tokens", "8", "--out", str(out)]
    command += ["--judge.backend", "feedback", "--guard.enabled", "false", "--train.nice", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        seen = []
        for line in proc.stdout:  # each line as eval prints it (flushed): wait for v0's point
            seen.append(line)
            if "step 0 (v0): held-out score" in line:
                break
        else:
            raise AssertionError("eval ended before measuring v0:\n" + "".join(seen))
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=limit(120))[0]
    finally:
        proc.kill()
    assert proc.returncode == 143, "".join(seen) + rest
    assert f"interrupted; wrote {out / 'report.json'}" in rest
    rl = json.loads((out / "report.json").read_text())["methods"]["rl"]
    assert rl["stopped"] == "interrupted" and rl["versions"] == ["v0"] and len(rl["task_scores"][0]) == 2
    run_dir = out / "runs" / "rl"
    assert rl["run_dir"] == str(run_dir) and json.loads((run_dir / "report.json").read_text())["methods"]
    assert (out / "report.md").is_file() and (out / "scores.png").read_bytes().startswith(PNG)
    # The server eval started (and its trainer) went with it: no process names the run folder.
    running = [p for p in Path("/proc").glob("[0-9]*") if str(run_dir) in _cmdline(p)]
    assert running == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # it ended meanwhile
        return ""
