"""The eval report: method entries, the step x method table, the signal line, the PNG, the
report.json lookup of `clawrl report`; and the pacing arithmetic."""

from __future__ import annotations

import hashlib
import json

import pytest

from clawrl.eval.history import HintRate, JudgmentPoint, RunHistory, VersionPoint, hint_rates, summary
from clawrl.eval.pacing import Pacer, expected_samples
from clawrl.eval.plot import plot_history, plot_scores
from clawrl.eval.report import (
    build_report,
    change,
    eval_entry_for,
    markdown,
    mean,
    method_entry,
    score_rows,
    sessions_to_effect,
    signal,
)
from clawrl.eval.scenario import Outcome, Point, Settings

PNG = b"\x89PNG\r\n\x1a\n"


def _outcome(method: str, scores: list[float], steps: list[int]) -> Outcome:
    points = [
        Point(step, f"v{step}", score, [score, score], [f"v{step}"], 10.0 * i)
        for i, (step, score) in enumerate(zip(steps, scores, strict=True))
    ]
    return Outcome(method, "feedback", points, conversations=7, answers=20, wall_s=123.45)


def _report(**methods: Outcome) -> dict:
    entries = {name: method_entry(o, f"/runs/{name}") for name, o in methods.items()}
    return build_report(
        "brief", entries, Settings(steps=2), ["m03", "m07"], "clawrl eval --steps 2", {"x": 1}
    )


def test_method_entry_lists_one_score_per_measured_version():
    entry = method_entry(_outcome("rl", [0.25, 0.5, 0.8125], [0, 1, 2]), "/runs/rl")
    assert entry["scores"] == [0.25, 0.5, 0.8125]
    assert entry["versions"] == ["v0", "v1", "v2"]
    assert entry["steps"] == [0, 1, 2]
    assert entry["task_scores"][1] == [0.5, 0.5]
    assert entry["wall_s"] == 123.5 and entry["run_dir"] == "/runs/rl" and entry["stopped"] == "done"
    assert change(entry) == pytest.approx(0.5625)
    assert change(method_entry(_outcome("rl", [0.3], [0]), None)) is None


def test_report_names_the_signal_that_taught():
    report = _report(rl=_outcome("rl", [0.2, 0.4, 0.6], [0, 1, 2]))
    assert report["persona"] == "brief" and report["judge"] == "feedback" and report["feedback"] is True
    assert report["signal"] == "explicit ratings and comments (POST /v1/feedback); judge backend 'feedback'"
    assert json.loads(json.dumps(report)) == report  # plain JSON data
    assert (
        signal("local:v0", False)
        == "the local:v0 judge reading the users' next messages; judge backend 'local:v0'"
    )
    assert "and the openai:m judge" in signal("openai:m", True)
    assert signal("feedback", False).startswith("nothing")


def test_markdown_table_has_a_row_per_step_and_a_column_per_method():
    report = _report(rl=_outcome("rl", [0.2, 0.4, 0.6], [0, 1, 2]), opd=_outcome("opd", [0.2, 0.7], [0, 2]))
    assert score_rows(report) == [
        (0, {"rl": (0.2, "v0"), "opd": (0.2, "v0")}),
        (1, {"rl": (0.4, "v1")}),
        (2, {"rl": (0.6, "v2"), "opd": (0.7, "v2")}),
    ]
    text = markdown(report)
    assert "- the users talked through the bare API" in text
    assert "| step | rl | opd |" in text
    assert "| 0 | 0.200 (v0) | 0.200 (v0) |" in text
    assert "| 1 | 0.400 (v1) | - |" in text
    assert "| 2 | 0.600 (v2) | 0.700 (v2) |" in text
    assert "| rl | +0.400 | - (of 0) | 124 s | 7 | 20 | done |" in text
    assert "| opd | +0.500 |" in text
    assert "`clawrl eval --steps 2`" in text and "m03, m07" in text


def test_sessions_to_a_stable_effect_is_the_first_of_three_passing_sessions_in_a_row():
    T, F = True, False
    assert sessions_to_effect([F, T, T, F, T, T, T, F]) == 5  # sessions 5, 6, 7
    assert sessions_to_effect([T, T, T]) == 1
    assert sessions_to_effect([T, T, F, T, T]) is None and sessions_to_effect([]) is None
    assert sessions_to_effect([F, T, T], stable=2) == 2
    # The base passing by chance is no effect: only sessions a trained version answered count.
    assert sessions_to_effect([T, T, T, F, T, T, T], learned=[F, F, F, F, T, T, T]) == 5
    assert sessions_to_effect([T, T, T, T], learned=[F, F, T, T]) is None
    outcome = _outcome("rl", [0.2, 0.6], [0, 1])
    outcome.sessions = [T, T, T, F, T, T, T, T]
    outcome.session_versions = ["v0", "v0", "v0", "v0", "v0", "v1", "v1", "v1"]
    entry = method_entry(outcome, None)
    assert entry["sessions_passed"] == outcome.sessions and entry["sessions_to_effect"] == 6
    assert entry["base_passed"] == [4, 5]
    text = markdown(_report(rl=outcome))
    assert "| rl | +0.400 | 6 (of 8; the base passed 4 of 5) |" in text


def test_mean_of_nothing_is_an_error():
    assert mean([0.5, 1.0]) == 0.75
    with pytest.raises(ValueError):
        mean([])


def test_scores_png_is_written(tmp_path):
    report = _report(rl=_outcome("rl", [0.2, 0.4, 0.6], [0, 1, 2]), opd=_outcome("opd", [0.2, 0.7], [0, 2]))
    path = plot_scores(report, tmp_path / "scores.png")
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000


def test_eval_entry_for_finds_the_runs_method(tmp_path):
    path = tmp_path / "report.json"
    assert eval_entry_for(path, "rl") is None
    with pytest.raises(ValueError, match="no eval report"):
        eval_entry_for(path, "rl", required=True)
    path.write_text(
        json.dumps(_report(rl=_outcome("rl", [0.2, 0.4], [0, 1]), opd=_outcome("opd", [0.1], [0])))
    )
    assert eval_entry_for(path, "opd")["scores"] == [0.1]
    assert eval_entry_for(path, "combine") is None
    path.write_text(json.dumps(_report(rl=_outcome("rl", [0.2, 0.4], [0, 1]))))
    assert eval_entry_for(path, None)["scores"] == [0.2, 0.4]  # the only method
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a clawrl eval report"):
        eval_entry_for(path, "rl")


# -- history ---------------------------------------------------------------------------


def _history() -> RunHistory:
    versions = [
        VersionPoint("v0", 0, 0.0),
        VersionPoint("v1", 1, 100.0, mean_reward=-0.5, loss=0.25, samples=4),
        VersionPoint("v2", 2, 200.0, mean_reward=0.5, loss=0.125, samples=4),
    ]
    judged = [(10, True), (50, False), (90, False), (120, True), (150, True), (260, False)]
    judgments = [JudgmentPoint(float(t), 1, hint) for t, hint in judged]
    return RunHistory(versions, judgments, {"trained": 8, "ready": 1, "stale": 0}, "combine")


def test_hint_rates_per_interval_between_versions():
    rates = hint_rates(_history())
    assert rates == [
        HintRate("v0", (100 - 10) / 60, pytest.approx(1 / 3), 3),
        HintRate("v1", (200 - 10) / 60, 1.0, 2),
        HintRate("v2", (260 - 10) / 60, 0.0, 1),
    ]
    assert hint_rates(RunHistory(_history().versions, [])) == []


def test_summary_lists_steps_rewards_hints_samples_and_eval_scores():
    text = summary(_history(), {"versions": ["v0", "v1"], "scores": [0.25, 0.5]})
    assert text.splitlines()[0] == "method combine: 2 training steps, 3 versions"
    assert "v1    step 1   samples 4  mean reward -0.50  loss 0.2500" in text
    assert "judgments: 6, with an accepted hint: 3 (50%)" in text
    assert "samples: trained 8, ready 1" in text
    assert "eval scores: v0 0.250, v1 0.500" in text


def test_history_png_has_an_eval_panel_when_scores_are_given(tmp_path):
    with_eval = plot_history(_history(), {"steps": [0, 1], "scores": [0.2, 0.5]}, tmp_path / "a.png")
    without = plot_history(_history(), None, tmp_path / "b.png")
    assert with_eval.read_bytes().startswith(PNG) and without.read_bytes().startswith(PNG)
    assert len(with_eval.read_bytes()) > len(without.read_bytes())


# -- pacing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "rating", "comment", "samples"),
    [
        ("rl", -1, "Answer in one short sentence.", 1),
        ("rl", 1, None, 1),
        ("opd", -1, "Answer in one short sentence.", 1),
        ("opd", -1, "too long", 0),  # a hint must be over 10 characters
        ("opd", 1, None, 0),
        ("combine", -1, "Answer in one short sentence.", 1),  # one opd sample carrying the -1
        ("combine", 1, None, 1),
    ],
)
def test_expected_samples_per_rating(method, rating, comment, samples):
    assert expected_samples(method, rating, comment) == samples


def test_expected_samples_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="known methods: rl, opd, combine"):
        expected_samples("ppo", 1, None)


def test_pacer_allows_one_step_of_samples_per_served_version():
    pacer = Pacer(per_step=3, start=5, stall_s=10.0)
    assert [pacer.take(0.0, 1) for _ in range(4)] == [True, True, True, False]
    assert pacer.blocked_since == 0.0
    pacer.served(6)
    assert pacer.budget == 6 and pacer.take(1.0, 2) and pacer.take(1.0, 2)  # 7 of 6: one over
    assert not pacer.take(1.0, 1)
    assert pacer.take(1.0, 0)  # a rating that makes no sample is never held back
    assert pacer.sent == 7


def test_pacer_lets_stalled_users_go_on_after_stall_s():
    pacer = Pacer(per_step=2, stall_s=10.0)
    assert pacer.take(0.0, 2) and not pacer.take(5.0, 1)
    assert not pacer.unstall(14.9)
    assert pacer.unstall(15.0) and pacer.budget == 4 and pacer.take(15.0, 1)
    assert not pacer.unstall(100.0)  # not blocked now


def test_unpaced_pacer_never_holds_back():
    pacer = Pacer(per_step=None)
    assert all(pacer.take(0.0, 2) for _ in range(100)) and pacer.budget is None
    with pytest.raises(ValueError):
        Pacer(per_step=0)


def test_the_canary_figures_of_each_version_make_a_table_in_report_md():
    from clawrl.eval.report import canary_rows
    from clawrl.types import Version

    figures = {"score": 0.45, "base_score": 0.44, "drop": -0.02, "accuracy": 0.5, "base_accuracy": 0.5}
    versions = [
        Version("v0", 0),
        Version("v1", 1, status="passed", canary=figures | {"kl": 0.01, "seconds": 3.2, "reason": None}),
        Version("v2", 2, status="held", canary=figures | {"kl": 0.9, "seconds": 3.0, "reason": "KL high"}),
    ]
    rows = canary_rows(versions)
    assert [(r["version"], r["status"]) for r in rows] == [("v1", "passed"), ("v2", "held")]
    report = {"persona": "brief", "held_out": [], "signal": "s", "command": "c", "methods": {}}
    entry = {"steps": [0], "scores": [0.5], "versions": ["v0"], "wall_s": 1.0, "conversations": 1}
    report["methods"]["rl"] = entry | {"answers": 1, "stopped": "done", "canary": rows}
    text = markdown(report)
    assert "Canary gate, `rl` (base: score 0.4400, right answers 50.0%)" in text
    assert "| v2 | held | 0.4500 | +2.0% | 50.0% | 0.9000 | 3.0 s |" in text


def test_the_collapse_panel_shows_each_versions_figures_and_marks_the_crossed_limits():
    """The canary's collapse figures (v1 passed, v2 held for a collapse it crossed) and the eval's
    own held-out self-ROUGE-L, v2's answers grown alike past 0.85: report.json rows and report.md."""
    from clawrl.eval.report import canary_rows
    from clawrl.types import Version

    base = {"base_entropy": 2.0, "base_self_rouge_l": 0.2}
    healthy = base | {"entropy": 1.8, "entropy_ratio": 0.9, "self_rouge_l": 0.25, "drift": 0.3, "crossed": []}
    collapsed = base | {"entropy": 0.8, "entropy_ratio": 0.4, "self_rouge_l": 0.3, "drift": 2.5}
    collapsed["crossed"] = ["entropy", "drift"]
    figures = {"score": 0.45, "base_score": 0.44, "drop": -0.02, "accuracy": 0.5, "base_accuracy": 0.5}
    versions = [
        Version("v0", 0),
        Version("v1", 1, status="passed", canary=figures | {"kl": 0.01, "seconds": 3.0, "collapse": healthy}),
        Version("v2", 2, status="held", canary=figures | {"kl": 0.02, "seconds": 3.0, "collapse": collapsed}),
    ]
    outcome = _outcome("rl", [0.2, 0.4, 0.6], [0, 1, 2])
    for point, rouge in zip(outcome.points, [0.3, 0.5, 0.9], strict=True):
        point.self_rouge_l = rouge
    entry = method_entry(outcome, "/runs/rl") | {"canary": canary_rows(versions)}
    guard = {"collapse_max_self_rouge_l": 0.85, "collapse_max_drift": 2.0, "hold_on_collapse": True}
    report = build_report("brief", {"rl": entry}, Settings(steps=2), ["m03"], "clawrl eval", {"guard": guard})
    assert report["collapse_limits"] == {
        "min_entropy_ratio": 0.6,
        "max_self_rouge_l": 0.85,
        "max_drift": 2.0,
        "max_entropy_ratio": 1.5,
        "hold_on_collapse": True,
    }
    rows = report["methods"]["rl"]["collapse"]
    assert [(r["version"], r["entropy"], r["drift"], r["crossed"]) for r in rows] == [
        ("v0", 2.0, 0.0, []),  # the base's figures, which every check keeps
        ("v1", 1.8, 0.3, []),
        ("v2", 0.8, 2.5, ["entropy", "drift", "held_out_self_rouge_l"]),
    ]
    assert [r["held_out_self_rouge_l"] for r in rows] == [0.3, 0.5, 0.9]
    text = markdown(report)
    limits = "answer entropy at least 0.6 of v0's and at most 1.5×, self-ROUGE-L at most 0.85"
    assert f"Collapse panel (limits: {limits}" in text
    assert "the canary gate holds a version past one" in text
    assert "| v0 | served | 2.000 (1.00×) | 0.200 | 0.300 | 0.000 | - |" in text
    assert "| v1 | passed | 1.800 (0.90×) | 0.250 | 0.500 | 0.300 | - |" in text
    assert (
        "| v2 | held | 0.800 (0.40×) | 0.300 | 0.900 | 2.500 | **entropy, drift, held_out_self_rouge_l** |"
        in text
    )


def test_without_canary_figures_the_panel_says_so_and_keeps_the_held_out_figure():
    outcome = _outcome("rl", [0.2, 0.4], [0, 1])
    outcome.points[0].self_rouge_l, outcome.points[1].self_rouge_l = 0.3, 0.95
    report = _report(rl=outcome)
    rows = report["methods"]["rl"]["collapse"]
    assert [(r["version"], r["entropy"], r["crossed"]) for r in rows] == [
        ("v0", None, []),
        ("v1", None, ["held_out_self_rouge_l"]),
    ]
    text = markdown(report)
    assert "(no canary figures: the canary gate was off" in text and "marks, does not hold," in text
    assert "| v1 | served | - | - | 0.950 | - | **held_out_self_rouge_l** |" in text


def test_the_report_names_the_persona_file_and_a_perfect_v0_has_nothing_to_learn():
    from clawrl.eval.personas import PERSONAS, get_persona

    source = get_persona("brief").source.as_json()
    perfect = method_entry(_outcome("rl", [1.0, 1.0], [0, 1]), None)  # every held-out task at 1.0
    learning = method_entry(_outcome("combine", [0.5, 0.75], [0, 1]), None)
    entries = {"rl": perfect, "combine": learning}
    report = build_report(
        "brief", entries, Settings(steps=1), ["m03"], "clawrl eval", {}, persona_file=source
    )
    assert report["persona_file"]["sha256"] == hashlib.sha256(PERSONAS["brief"].read_bytes()).hexdigest()
    assert report["persona_file"]["path"] == str(PERSONAS["brief"].resolve())
    assert perfect["nothing_to_learn"] and not learning["nothing_to_learn"]
    text = markdown(report)
    assert f"- persona file: `{source['path']}` (sha256 `{source['sha256']}`, tasks `math`)" in text
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| rl |")}
    assert "| rl | nothing to learn (v0 meets every check) |" in rows["| rl"]
    assert "| combine | +0.250 |" in text
