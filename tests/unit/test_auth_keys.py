"""Whose a key is (api/auth.py, docs/users.md): the admin's, a user's, or nobody's; and the session
names a caller's requests are stored under."""

from __future__ import annotations

from clawrl.api.auth import ANYONE, Caller, Keys, dashboard_token

USERS = {"sk-alice": "alice", "sk-bob": "bob"}


def test_each_key_names_its_caller_and_an_unknown_one_nobody():
    keys = Keys("admin-key", USERS)
    assert keys.who("admin-key") == Caller("default", admin=True, several=True)
    assert keys.who("sk-alice") == Caller("alice", admin=False, several=True)
    assert keys.who("sk-bob").owner == "bob" and keys.who("admin-key").owner is None
    for wrong in ("", "sk-alic", "sk-alice ", "SK-ALICE", "admin-key2"):
        assert keys.who(wrong) is None
    assert keys.by_cookie(dashboard_token("sk-bob")) == keys.who("sk-bob")
    assert keys.by_cookie("sk-bob") is None  # the cookie holds an HMAC of the key, never the key


def test_without_users_there_is_one_user_who_sees_everything():
    assert Keys("admin-key").who("admin-key") == Caller("default", admin=True, several=False)
    assert not Keys(None).required and Keys("k").required
    assert ANYONE.owner is None and ANYONE.session_id("main") == "main" == ANYONE.shown("main")


def test_with_users_a_named_session_is_the_users_own():
    alice, admin = Caller("alice", admin=False, several=True), Caller(several=True)
    assert alice.session_id("main") == "alice/main" and alice.shown("alice/main") == "main"
    assert alice.session_id("bob/main") == "alice/bob/main"  # a name cannot reach another's session
    assert admin.session_id("main") == "default/main"
    assert alice.shown("sess-0f3a") == "sess-0f3a"  # an inferred session's id is shown as it is
