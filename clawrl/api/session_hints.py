"""Reading what a request says about its session: headers first, then body fields.

`X-Session-Id` / `session_id` name the session, `X-Turn-Type` / `turn_type`
(main | side) type the turn, `X-Session-Done` / `session_done` end the session
after this answer. Malformed headers are a 400, not silently ignored.

Failing those, a session affinity key names it (`collect.affinity_keys`): the
headers OpenClaw sends with `compat.sendSessionAffinityHeaders` on an
openai-completions model (`x-session-affinity`, `session_id`; it also sets
`x-client-request-id` to the same key, which OpenAI defines per request, so it
is not read), then the `prompt_cache_key` body field (OpenClaw with
`compat.supportsPromptCacheKey`, and OpenAI SDK users). These keys are meant for
other servers, so a value that is not a valid session id is never an error: it
is hashed into one.
"""

from __future__ import annotations

import hashlib
import re

from starlette.datastructures import Headers

from clawrl.api.auth import ANYONE, Caller
from clawrl.api.errors import BadRequest
from clawrl.api.schemas import SESSION_ID_PATTERN, ChatCompletionRequest
from clawrl.sessions.tracker import Hints

_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


AFFINITY_HEADERS = ("x-session-affinity", "session_id")


def hints_from(
    headers: Headers, body: ChatCompletionRequest, affinity_keys: bool = True, caller: Caller = ANYONE
) -> Hints:
    """What the request says of its session, for `caller`: with several users, a session it names is
    one of the caller's own (`Caller.session_id`) and inference matches only the caller's sessions."""
    session_id, source = body.session_id, "body"
    header_id = headers.get("x-session-id")
    if header_id is not None:
        if not _SESSION_ID.match(header_id):
            raise BadRequest(
                "X-Session-Id must be 1-128 characters of letters, digits and ._:@/+=-", param="X-Session-Id"
            )
        session_id, source = header_id, "header"
    if session_id is None and affinity_keys:
        session_id, source = _affinity(headers, body), "affinity"
    turn_type = _turn_type(headers.get("x-turn-type")) or body.turn_type
    done = _flag(headers.get("x-session-done"))
    return Hints(
        session_id=caller.session_id(session_id) if session_id else None,
        user=caller.user,
        source=source if session_id else "inferred",
        turn_type=turn_type,
        done=done if done is not None else bool(body.session_done),
    )


def _affinity(headers: Headers, body: ChatCompletionRequest) -> str | None:
    keys = [headers.get(name) for name in AFFINITY_HEADERS] + [body.prompt_cache_key]
    key = next((k.strip() for k in keys if k and k.strip()), None)
    if key is None or _SESSION_ID.match(key):
        return key
    return "aff-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _turn_type(value: str | None):
    if value is None:
        return None
    if value.strip().lower() not in ("main", "side"):
        raise BadRequest("X-Turn-Type must be 'main' or 'side'", param="X-Turn-Type")
    return value.strip().lower()


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v not in _TRUE | _FALSE:
        raise BadRequest("X-Session-Done must be true or false", param="X-Session-Done")
    return v in _TRUE
