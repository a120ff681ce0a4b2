"""Escaping and exhausting the sandbox, for real (bwrap): each attempt is contained, the episode
gets its reason, the host is untouched, and the next command runs as before."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from clawrl.envs.harbor.env import HarborEnv
from clawrl.envs.harbor.sandbox import Limits, Mount, Sandbox, give_to, new_uid
from tests.timing import limit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "clawrl" / "envs" / "shipped" / "harbor_sets"


@pytest.fixture
def box(bwrap, tmp_path):
    workspace = Path(tempfile.mkdtemp(prefix="clawrl-test-ws-"))
    uid = new_uid()
    give_to(workspace, uid)
    sandbox = Sandbox(bwrap, uid)

    def run(command: str, **limits):
        return sandbox.run(command, [Mount(workspace, "/app", writable=True)], "/app", Limits(**limits))

    yield run, workspace
    subprocess.run(["rm", "-rf", str(workspace)], check=False)


def test_the_workspace_is_writable_and_nothing_else_is(box, tmp_path):
    run, workspace = box
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host data")
    done = run(
        f"echo made > made.txt; echo x > /etc/evil; echo x > /usr/evil; cat {secret}; ls /root; "
        "touch /tmp/private && echo tmp-ok"
    )
    assert done.exit_code == 0 and done.reason is None, done
    assert (workspace / "made.txt").read_text() == "made\n"
    assert (
        "Read-only file system" in done.output and "host data" not in done.output and "tmp-ok" in done.output
    )
    assert (
        not Path("/etc/evil").exists()
        and not Path("/usr/evil").exists()
        and not Path("/tmp/private").exists()
    )


def test_the_network_is_unreachable_even_on_the_hosts_loopback(box):
    run, _ = box
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('REACHED')"
        done = run(
            f'python3 -c "{code}"; ip -o link 2>/dev/null | wc -l; cat /etc/hostname >/dev/null; echo end'
        )
        assert "REACHED" not in done.output and "Connection refused" in done.output, done.output
        assert not accepted
    finally:
        listener.close()


def test_a_fork_bomb_stops_at_the_process_limit_and_the_next_command_runs(box):
    run, _ = box
    bomb = run(":(){ :|:& };:; sleep 1; echo survived", processes=32, wall_s=limit(30))
    assert "Resource temporarily unavailable" in bomb.output or bomb.reason is not None, bomb
    again = run("echo fine")
    assert again.exit_code == 0 and again.output == "fine\n"
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_sleep_forever_ends_at_the_wall_time_with_its_reason(box):
    run, _ = box
    done = run("sleep 1000 & sleep 1000", wall_s=2)
    assert done.reason == "wall time" and done.seconds < limit(30)
    assert "sleep 1000" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_gigabytes_of_output_are_cut_off_and_what_comes_back_is_clipped(box):
    run, workspace = box
    flood = run("yes 'a line of output'", output_kill_bytes=4 << 20, output_bytes=1000, wall_s=limit(60))
    assert flood.reason == "output limit" and len(flood.output) < 1200 and "left out" in flood.output
    big = run("head -c 2000000000 /dev/zero > big.bin", file_mb=8)
    assert big.reason is not None and "signal 25" in big.reason  # SIGXFSZ
    assert (workspace / "big.bin").stat().st_size <= 8 << 20


def test_memory_and_cpu_limits_end_a_hungry_command(box):
    run, _ = box
    hungry = run("python3 -c 'x = bytearray(2 << 30); print(len(x))'", memory_mb=256)
    assert hungry.exit_code != 0 and "MemoryError" in hungry.output
    spin = run("python3 -c 'while True: pass'", cpu_s=1, wall_s=limit(30))
    assert spin.reason is not None and "signal" in spin.reason and spin.seconds < limit(20)


def write_task(root: Path, name: str, verifier: str, toml: str = "[verifier]\ntimeout_sec = 3\n") -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "instruction.md").write_text("Write hello into /app/out.txt.\n")
    (folder / "task.toml").write_text(toml)
    (folder / "tests" / "test.sh").write_text(verifier)
    return folder


@pytest.mark.parametrize(
    ("name", "verifier", "reason"),
    [
        ("hangs", "sleep 1000\n", "the verifier ended: wall time"),
        ("silent", "echo checked\n", "the verifier wrote no reward"),
        ("garbage", "echo lots > /logs/verifier/reward.txt\n", "not a number"),
        ("bad-json", "echo '{\"score\": 1}' > /logs/verifier/reward.json\n", "not a number"),
    ],
)
def test_a_verifier_that_hangs_or_writes_no_number_gives_0_with_its_reason(
    bwrap, tmp_path, name, verifier, reason
):
    env = HarborEnv()
    env.reset(task_dir=str(write_task(tmp_path, name, verifier)))
    assert env.get_reward() == 0.0
    assert env.reward_reason is not None and reason in env.reward_reason, env.reward_reason


def test_an_episode_reaches_the_verifier_through_the_bash_tool(bwrap, tmp_path):
    verifier = 'test "$(cat /app/out.txt)" = hello && echo 1 > /logs/verifier/reward.txt\n'
    task = write_task(tmp_path, "hello", verifier)
    env = HarborEnv()
    observation = env.reset(task_dir=str(task))
    assert "/app" in observation
    said = env.bash("echo hello > out.txt; pwd; echo $HOME")
    assert said.splitlines()[:2] == ["/app", "/tmp"] and said.endswith("[exit code 0]")
    assert "[exit code 3]" in env.bash("exit 3")
    folder = env._folder
    assert env.get_reward() == 1.0 and env.reward_reason is None
    assert folder is not None and not folder.exists()  # the episode's copy is gone
    fresh = HarborEnv()
    fresh.reset(task_dir=str(task))
    assert fresh.get_reward() == 0.0  # a fresh workspace each episode


def _check(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "clawrl", "envs", "check", *args]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=limit(600), env=env)


@pytest.mark.parametrize("name", ["terminal", "repository"])
def test_every_shipped_task_is_solved_by_its_solution_and_not_by_doing_nothing(bwrap, name):
    done = _check("--env", f"harbor:{name}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "solution 1.00" in line and "nothing 0.00" in line]
    assert len(lines) == len(list((SHIPPED / name).iterdir())), done.stdout


def test_envs_check_names_each_failing_or_refused_task_and_exits_1(bwrap, tmp_path):
    good = write_task(tmp_path, "good", "echo 1 > /logs/verifier/reward.txt\n")
    (good / "solution").mkdir()
    (good / "solution" / "solve.sh").write_text("true\n")
    (write_task(tmp_path, "broken", "echo 1\n") / "instruction.md").unlink()
    done = _check("--env", f"harbor:{tmp_path}")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {
        line.split()[0]: line for line in done.stdout.splitlines() if line and not line.startswith("clawrl")
    }
    assert "solution 1.00" in lines["good"] and "doing nothing scores 1" in lines["good"]
    assert "refused" in lines["broken"] and "no instruction.md" in lines["broken"]
    missing = _check("--env", f"harbor:{tmp_path / 'nowhere'}")
    assert missing.returncode == 2 and "not a folder of Harbor tasks" in missing.stderr
