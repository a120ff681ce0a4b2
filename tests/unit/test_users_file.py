"""The users file (`server.users`, docs/users.md): a good file is read as key -> name; a bad one is
refused by `clawrl serve` at start, exit 2, with a message naming the file and the problem."""

from __future__ import annotations

import json

import pytest

from clawrl.cli import main
from clawrl.config.users import UsersFileError, parse_users, read_users

ADMIN = "admin-key-0123456789"


def test_a_users_file_maps_each_key_to_its_user():
    text = json.dumps({"alice": "sk-alice-1", "bob_2": "sk-bob-2", "c-3": "k"})
    assert parse_users(text, ADMIN) == {"sk-alice-1": "alice", "sk-bob-2": "bob_2", "k": "c-3"}
    assert parse_users("{}", ADMIN) == {}  # every user removed: only the admin key is served


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not JSON"),
        ('["alice", "k"]', "must be a JSON object"),
        ('{"alice": "k1", "alice": "k2"}', "'alice' is named twice"),
        ('{"alice": "k", "bob": "k"}', "'alice' and 'bob' have the same key"),
        ('{"Alice": "k"}', "'Alice' is not 1-32 of a-z"),
        ('{"a b": "k"}', "'a b' is not 1-32"),
        ('{"' + "a" * 33 + '": "k"}', "is not 1-32"),
        ('{"": "k"}', "'' is not 1-32"),
        ('{"default": "k"}', "'default' is reserved"),
        ('{"v12": "k"}', "'v12' is reserved: it is named like a version"),
        ('{"alice": 7}', "the key of 'alice' is not a string"),
        ('{"alice": {"key": "k"}}', "the key of 'alice' is not a string"),
        ('{"alice": ""}', "the key of 'alice' is empty"),
        ('{"alice": "k k"}', "has white space"),
        ('{"alice": "' + ADMIN + '"}', "the key of 'alice' is the admin key"),
    ],
)
def test_a_bad_users_file_says_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        parse_users(text, ADMIN)


def test_an_unreadable_users_file_names_itself(tmp_path):
    with pytest.raises(UsersFileError, match=f"cannot read the users file {tmp_path / 'none.json'}"):
        read_users(tmp_path / "none.json", ADMIN)


def serve(tmp_path, *args: str) -> list[str]:
    return ["serve", "--run-dir", str(tmp_path / "run"), *args]


@pytest.mark.parametrize(
    ("users", "problem"),
    [
        ({"alice": "k1", "bob": "k1"}, "'alice' and 'bob' have the same key"),
        ({"alice": ADMIN}, "the key of 'alice' is the admin key"),
    ],
)
def test_serve_refuses_a_bad_users_file_at_start(tmp_path, capsys, users, problem):
    path = tmp_path / "users.json"
    path.write_text(json.dumps(users))
    assert main(serve(tmp_path, "--server.users", str(path), "--server.api-key", ADMIN)) == 2
    err = capsys.readouterr().err
    assert f"the users file {path}: {problem}" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_serve_refuses_users_without_an_admin_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CLAWRL_API_KEY", raising=False)
    path = tmp_path / "users.json"
    path.write_text('{"alice": "k1"}')
    assert main(serve(tmp_path, "--server.users", str(path))) == 2
    assert f"the users file {path} needs an admin key" in capsys.readouterr().err


def test_serve_refuses_a_repeated_name_in_the_file(tmp_path, capsys):
    path = tmp_path / "users.json"
    path.write_text('{"alice": "k1", "alice": "k2"}')
    assert main(serve(tmp_path, "--server.users", str(path), "--server.api-key", ADMIN)) == 2
    assert "'alice' is named twice" in capsys.readouterr().err


def test_the_config_parses_the_users_file_once_as_it_is_resolved(tmp_path):
    """Every part of a process asks the resolved config for the users (`server.user_names`,
    `server.user_keys`); none reads the file again, so a file edited meanwhile changes nothing."""
    from clawrl.config import load_config

    path = tmp_path / "users.json"
    path.write_text(json.dumps({"alice": "sk-alice-1", "bob": "sk-bob-2"}))
    server = load_config(overrides={"server": {"users": str(path)}}).server
    path.write_text(json.dumps({"carol": "sk-carol-3"}))
    assert server.user_keys == {"sk-alice-1": "alice", "sk-bob-2": "bob"}
    assert server.user_names == {"alice", "bob", "default"}
    assert load_config().server.user_keys is None
    assert load_config().server.user_names == {"default"}


def test_a_bad_users_file_is_refused_when_the_config_is_asked_for_its_users(tmp_path):
    path = tmp_path / "users.json"
    path.write_text('{"alice": "k1", "bob": "k1"}')
    from clawrl.config import load_config

    server = load_config(overrides={"server": {"users": str(path)}}).server  # `clawrl serve` refuses it
    with pytest.raises(UsersFileError, match="'alice' and 'bob' have the same key"):
        _ = server.user_names
