"""`clawrl envs train|eval` on bad input: one clear line and exit status 2, before any server starts.
(A group through a live server: tests/service/test_envs.py; the embedded model: tests/slow/test_envs.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from clawrl.cli import main
from tests.conftest import CLAWRL, ROOT


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_a_bad_environment_exits_2_naming_it_as_a_real_process(tmp_path):
    env = tmp_path / "broken_env.py"
    env.write_text("import this_module_does_not_exist\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [*CLAWRL, "envs", "train", "--env", f"{env}:Env", "--tasks", str(env),
         "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"clawrl: error: environment: importing {env} failed: ModuleNotFoundError" in done.stderr
    assert not out.exists()


@pytest.fixture
def files(tmp_path):
    (tmp_path / "envs.py").write_text(
        "class Crashes:\n    def __init__(self):\n        raise RuntimeError('needs a GPU')\n"
        "class Fine:\n    def reset(self, **row):\n        return None\n"
        "    def get_reward(self):\n        return 1.0\n"
        "    def act(self, x: int) -> int:\n"
        "        '''Act.\n\n        Args:\n            x: a number\n        '''\n"
        "        return x\n"
    )
    (tmp_path / "tasks.jsonl").write_text('{"prompt": "go"}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": "go"}\n{"no": "prompt"}\n')
    return tmp_path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "{d}/envs.py:Crashes"],
         "cannot construct environment envs:Crashes: RuntimeError: needs a GPU"),
        (["--env", "{d}/envs.py:Missing"], "has no 'Missing'"),
        (["--env", "{d}/envs.py:Fine", "--tasks", "{d}/bad.jsonl"], "bad.jsonl:2: a task is a JSON object"),
        (["--env", "{d}/envs.py:Fine"], "is not a shipped one: give its tasks with --tasks FILE.jsonl"),
        (["--env", "{d}/envs.py:Fine", "--tasks", "{d}/tasks.jsonl", "--tool-choice", "act,fly"],
         "--tool-choice names fly; envs:Fine's tools are act"),
        (["--env", "calculator", "--split", "test"],
         "--split 'test': calculator has the splits train, held_out"),
        (["--env", "calculator", "--group-size", "1"], "--group-size must be at least 2"),
        (["--env", "calculator", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--env", "calculator", "--reward", "{d}/envs.py:nothing"], "reward function {d}/envs.py:nothing"),
    ],
)  # fmt: skip
def test_envs_train_refuses_bad_input_before_starting_anything(capsys, files, args, message):
    out = files / "out"
    argv = [
        "envs",
        "train",
        *(a.format(d=files) for a in args),
        "--out",
        str(out),
        "--base-url",
        "http://127.0.0.1:9",
    ]
    code, err = _run(capsys, *argv)
    assert code == 2, err
    assert message.format(d=files) in err
    assert not out.exists()


def test_envs_train_says_when_no_server_answers(capsys, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    code, err = _run(
        capsys, "envs", "train", "--env", "calculator", "--base-url", url, "--out", str(tmp_path / "o")
    )
    assert code == 2 and f"GET {url}/healthz failed: ConnectError" in err


def test_envs_eval_needs_a_run_or_a_server(capsys, tmp_path):
    code, err = _run(capsys, "envs", "eval", "--env", "calculator", "--out", str(tmp_path / "o"))
    assert code == 2 and "give the run to measure with --run-dir, or a running server with --base-url" in err
    code, err = _run(
        capsys,
        "envs",
        "eval",
        "--env",
        "calculator",
        "--run-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert code == 2 and f"no clawrl.db in {tmp_path}" in err


def test_help_lists_envs_and_stays_light():
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; from clawrl.cli import main\ntry: main(['envs', 'train', '--help'])\n"
         "except SystemExit: pass\nprint('torch' in sys.modules, 'httpx' in sys.modules)"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    assert "--tool-choice" in out and "--group-size" in out
    assert out.strip().endswith("False False")  # argparse only: heavy imports wait for the command
