"""`clawrl eval` and `clawrl report` on bad input: a clear message and exit status 2, and
nothing started. (The happy paths run a real server: tests/slow/test_eval.py.)"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.eval.commands import EVAL_CONFIG
from clawrl.eval.run import make_plan, parse_methods


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_help_lists_eval_and_report_and_stays_light():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from clawrl.cli import main\ntry: main(['--help'])\n"
            "except SystemExit: pass\nprint('torch' in sys.modules, 'httpx' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "eval" in out and "report" in out
    assert out.strip().endswith("False False")  # argparse only: heavy imports wait for the command


def test_unknown_persona_fails_before_anything_starts(capsys, tmp_path):
    code, err = _run(capsys, "eval", "--persona", "wizard", "--out", str(tmp_path / "out"))
    assert code == 2
    assert "unknown persona 'wizard'; known personas: student, teacher, brief, pirate" in err
    assert not (tmp_path / "out").exists()


def test_unreachable_base_url_fails_with_the_address(capsys, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    code, err = _run(capsys, "eval", "--base-url", url, "--out", str(tmp_path / "out"), "--steps", "1")
    assert code == 2
    assert f"no clawrl server at {url}" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "rl,ppo"], "unknown method 'ppo'"),
        (["--method", "rl,rl"], "names a method twice"),
        (["--held-out", "0"], "--held-out must be at least 1"),
        (["--held-out", "48"], "leaves no training tasks"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--tasks", "physics"], "unknown task set 'physics'"),
        (["--persona-base-url", "http://127.0.0.1:1/v1"], "--persona-base-url needs --persona-model"),
        (["--base-url", "http://127.0.0.1:1", "--model", "/m"], "--model is for the servers eval starts"),
        (["--users", "brief,wizard"], "--users: unknown persona wizard"),
        (["--users", "brief,stepwise", "--persona", "brief"], "leave --persona out"),
        (["--users", "brief,stepwise", "--method", "rl,combine"], "--users runs one method"),
        (
            ["--users", "brief,stepwise", "--base-url", "http://127.0.0.1:1"],
            "--users does not go with --base-url",
        ),
        (["--users", "brief", "--via", "openclaw"], "bare API only"),
    ],
)
def test_bad_options_are_named(capsys, tmp_path, argv, message):
    code, err = _run(capsys, "eval", "--out", str(tmp_path / "out"), *argv)
    assert code == 2
    assert message in err
    assert not (tmp_path / "out").exists()  # nothing started, no users file written


def test_via_openclaw_without_openclaw_names_the_setup_script(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWRL_CACHE_DIR", str(tmp_path / "empty-cache"))  # no OpenClaw installed there
    code, err = _run(capsys, "eval", "--via", "openclaw", "--out", str(tmp_path / "out"), "--steps", "1")
    assert code == 2
    assert "--via openclaw needs the OpenClaw agent: install it once with" in err and "setup-openclaw" in err
    assert not (tmp_path / "out").exists()  # nothing started


def test_bad_config_override_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--out", str(tmp_path), "--train.batch-size", "zero"])
    assert exit_info.value.code == 2
    assert "batch_size" in capsys.readouterr().err


def test_methods_parse_and_a_running_server_has_one():
    assert parse_methods("rl, opd,combine", "combine", remote=False) == ["rl", "opd", "combine"]
    assert parse_methods(None, "combine", remote=False) == ["combine"]
    assert parse_methods(None, "combine", remote=True) == [None]
    with pytest.raises(ValueError, match="one method"):
        parse_methods("rl,opd", "combine", remote=True)


def test_plan_refuses_a_used_run_folder_and_paces_by_batch_size(tmp_path):
    from clawrl.config import load_config

    config = load_config(EVAL_CONFIG, {"train": {"batch_size": 6}})
    args = argparse.Namespace(
        persona="brief", persona_base_url=None, max_turns=3, method="rl", base_url=None, tasks="math",
        held_out=4, seed=0, steps=2, max_tokens=64, concurrency=2, samples_per_step=None, no_feedback=False,
        stall_s=60.0, max_wall_s=600.0, out=tmp_path / "out", run_dir=None, model=None, via="api",
        points_every=4,
    )  # fmt: skip
    plan = make_plan(config, args)
    assert plan.settings.samples_per_step == 6 and plan.run_root == tmp_path / "out" / "runs"
    assert len(plan.held_out) == 4 and len(plan.train) == 44 and plan.persona.name == "brief"
    (tmp_path / "out" / "runs" / "rl").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "rl" / "clawrl.db").write_bytes(b"")
    with pytest.raises(ValueError, match="holds a run already"):
        make_plan(config, args)


def test_plan_takes_a_persona_file_and_its_own_tasks(tmp_path):
    from clawrl.config import load_config

    (tmp_path / "t.jsonl").write_text(
        "".join(f'{{"id": "q{i}", "question": "Say {i}."}}\n' for i in range(6))
    )
    (tmp_path / "mine.toml").write_text(
        'name = "mine"\ndescription = "d"\nopenings = ["{question}"]\ntasks = "t.jsonl"\n\n[[checks]]\n'
        'kind = "max_words"\nwords = 5\ncomplaints = ["Shorter."]\nhints = ["At most 5 words."]\n'
    )
    args = argparse.Namespace(
        persona=str(tmp_path / "mine.toml"), persona_base_url=None, max_turns=3, method="rl", base_url=None,
        tasks=None, held_out=2, seed=0, steps=1, max_tokens=64, concurrency=1, samples_per_step=None,
        no_feedback=False, stall_s=60.0, max_wall_s=600.0, out=tmp_path / "out", run_dir=None, model=None,
        via="api", points_every=4,
    )  # fmt: skip
    plan = make_plan(load_config(EVAL_CONFIG), args)
    assert plan.persona.name == "mine" and len(plan.train) == 4 and len(plan.held_out) == 2
    assert {t.answer for t in plan.train} == {None}
    assert plan.persona_file is not None and plan.persona_file["path"] == str(
        (tmp_path / "mine.toml").resolve()
    )


def test_eval_default_config_is_clawrls_defaults_not_a_run_folders(tmp_path, monkeypatch):
    from clawrl.cli import _config_file, build_parser
    from clawrl.config import Config, load_config

    monkeypatch.chdir(tmp_path)  # a ./clawrl-run/config.json here must not leak into eval's servers
    Config(method="opd", run_dir=Path("clawrl-run")).run_dir.mkdir()
    Config(method="opd", run_dir=Path("clawrl-run")).write()
    args, _ = build_parser().parse_known_args(["eval", "--steps", "1"])
    assert _config_file(args) == EVAL_CONFIG
    assert load_config(EVAL_CONFIG).model_dump() == Config().model_dump()


def test_report_on_a_folder_without_a_store_fails(capsys, tmp_path):
    code, err = _run(capsys, "report", "--run-dir", str(tmp_path))
    assert code == 2
    assert f"no clawrl.db in {tmp_path}" in err
