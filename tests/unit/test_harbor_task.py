"""Reading Harbor task folders: what a task author gets for a good folder and for a bad one."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawrl.envs.errors import TaskError
from clawrl.envs.harbor.env import place_files, rows
from clawrl.envs.harbor.task import load_task, load_tasks, parse_memory

SHIPPED = Path(__file__).resolve().parents[2] / "clawrl" / "envs" / "shipped" / "harbor_sets"


def make(root: Path, name: str, toml: str = "", dockerfile: str | None = None, **files: str) -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "instruction.md").write_text("Do the thing.\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text(toml)
    if dockerfile is not None:
        (folder / "environment").mkdir()
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in files.items():
        path = folder / "environment" / rel.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_a_terminal_bench_2_task_toml_is_read_with_its_older_spellings(tmp_path):
    toml = 'version = "1.0"\n[verifier]\ntimeout_sec = 900.0\n[agent]\ntimeout_sec = 1800\n'
    toml += '[environment]\ncpus = 2\nmemory = "2G"\nallow_internet = true\n'
    task = load_task(make(tmp_path, "tb2", toml))
    assert (task.verifier_timeout_s, task.agent_timeout_s, task.cpus) == (900.0, 1800.0, 2.0)
    assert task.memory_mb == 2048 and task.allow_internet and task.workdir == "/app"
    harbor = load_task(make(tmp_path, "new", "[environment]\nmemory_mb = 512\n"))
    assert harbor.memory_mb == 512 and harbor.verifier_timeout_s == 120.0
    assert [parse_memory(v) for v in ("512M", "1.5g", "4096", 300, "2Gi")] == [512, 1536, 4096, 300, 2048]


def test_the_dockerfile_places_files_and_every_other_step_is_listed_as_skipped(tmp_path):
    dockerfile = (
        "FROM python:3.12-slim\nRUN apt-get update && \\\n    apt-get install -y jq\nWORKDIR /srv\n"
        "ENV MODE=test LEVEL=2\nCOPY files/ /srv/\nCOPY one.txt data/\nCOPY two.txt /srv/renamed.txt\n"
        "COPY three.txt /etc/three.txt\nCOPY --from=builder /out /srv/out\nRUN pip install numpy\n"
    )
    folder = make(
        tmp_path, "t", dockerfile=dockerfile,
        files__a="A", files__sub__b="B", **{"one.txt": "1", "two.txt": "2", "three.txt": "3"},
    )  # fmt: skip
    task = load_task(folder)
    assert task.workdir == "/srv" and task.env == {"MODE": "test", "LEVEL": "2"}
    assert task.skipped == (
        "RUN apt-get update && apt-get install -y jq",
        "COPY --from=builder /out /srv/out",
        "RUN pip install numpy",
        "COPY three.txt /etc/three.txt",  # outside the workspace
    )
    workspace = tmp_path / "ws"
    place_files(task, workspace)
    found = {str(p.relative_to(workspace)): p.read_text() for p in workspace.rglob("*") if p.is_file()}
    assert found == {"a": "A", "sub/b": "B", "data/one.txt": "1", "renamed.txt": "2"}


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ("instruction", "no instruction.md"),
        ("verifier", "no tests/test.sh"),
        ("toml", "task.toml is not readable TOML"),
        ("timeout", "verifier.timeout_sec must be a positive number"),
        ("memory", "is not a size like '2G'"),
    ],
)
def test_a_bad_task_folder_is_refused_with_its_path_and_reason_and_the_others_load(tmp_path, broken, reason):
    make(tmp_path, "good")
    bad = make(tmp_path, "bad")
    if broken == "instruction":
        (bad / "instruction.md").unlink()
    elif broken == "verifier":
        (bad / "tests" / "test.sh").unlink()
    elif broken == "toml":
        (bad / "task.toml").write_text("[verifier\ntimeout_sec = ")
    elif broken == "timeout":
        (bad / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    else:
        (bad / "task.toml").write_text('[environment]\nmemory = "lots"\n')
    tasks, refused = load_tasks(tmp_path)
    assert [t.name for t in tasks] == ["good"]
    assert [(path.name, reason in why, str(bad) in why) for path, why in refused] == [("bad", True, True)]
    with pytest.raises(TaskError, match=reason.replace("(", r"\(")):
        load_task(bad)


def test_a_folder_without_any_usable_task_is_an_error_naming_it(tmp_path):
    with pytest.raises(TaskError, match="not a folder"):
        load_tasks(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="no usable task"):
        load_tasks(tmp_path / "empty")


def test_the_shipped_sets_load_whole_and_split_train_from_held_out():
    terminal, refused = load_tasks(SHIPPED / "terminal")
    repository, refused_too = load_tasks(SHIPPED / "repository")
    assert not refused and not refused_too
    assert len(terminal) >= 30 and len(repository) >= 10
    assert all(t.solution is not None and not t.skipped for t in terminal + repository)
    train, held = rows(SHIPPED / "terminal", "train"), rows(SHIPPED / "terminal", "held_out")
    assert len(train) + len(held) == len(terminal) and not {r["id"] for r in train} & {r["id"] for r in held}
    assert all(r["prompt"] and Path(r["task_dir"]).is_dir() for r in train + held)
