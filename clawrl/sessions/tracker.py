"""Which session a request belongs to, and which earlier turn it gives the next state of.

A pure state machine (the caller passes the clock). Resolution, in order:

1. `X-Session-Id` header, then the `session_id` body field: the client names the
   session, and the messages after its last answer are that answer's next state.
2. A session affinity key (OpenClaw's `x-session-affinity` / `session_id` headers,
   the `prompt_cache_key` body field): it names the session too, but proves less,
   since a client may share one key across conversations. A request that continues
   the named session's history attaches its next state; one that does not is
   matched by inference (3) instead, then by a rewritten answer (below), and failing
   those joins the named session without a next state, so no feedback is ever paired
   with the wrong answer.
3. Otherwise inference from the history: a request whose messages begin with a
   known session's last main request *plus the answer we gave* continues that
   session. The longest such history wins; everything after it is the next
   state of that answer. Anything else opens a new session, so a client that
   edits or truncates its history (memory compaction) starts afresh, and two
   clients never share a session unless their histories are identical.

A *rewritten answer* is matched only in a session the request names (1 or 2): the
request resends the last main request's messages unchanged, then one assistant message
where our answer stood, with other text (OpenClaw 2026.9.6 strips `<think>` blocks and
reply directives such as `[[reply_to_current]]`; a client may fold, trim or truncate a
long answer) but the same tool calls, then new messages
starting with a user or tool message. Those are the answer's next state, and the match
is recorded as `rewritten` (`Resolution.next_state_match`), so a reader knows the client
kept, and may have shown, another text than the recorded answer. Any other difference
(an edited earlier message, a message more or less, another role, other tool calls) is
no rewrite: an affinity key's request then gets no next state, as before, and a named
session's falls back to what follows its last assistant message (`named`). Inference
(3) never matches a rewritten answer: without a name, the messages before it are all
that tie a request to a conversation, and two clients asking the same question must
stay apart.

Each session's last answer (its *tip*) can be continued once. When several
sessions share a tip (two clients sent the same messages and got the same
greedy answer), continuations take them oldest first: their (state, answer)
pairs are identical, so each next state is still attached to a turn with
exactly that context.

With several users (docs/users.md) every request carries its user (`Hints.user`), and inference
matches only that user's sessions: one user's request never continues, nor gives feedback to,
another's conversation. (The sessions a client names are kept apart before they get here: the
gateway names them within their user, `api.auth.Caller.session_id`.)

Side turns (see `turn_type`) join the session they continue, but neither take
its tip nor become anyone's next state. Messages a client injects around the
conversation (`injected`) are left out of every match and next state.

Decision (docs/design.md, "One turn's life", step 2): a request that repeats a
known prefix without continuing it is *not* classified side, because two
unrelated clients opening with the same system prompt and "hi" would then lose
the second conversation's training data. It opens a new session instead.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from clawrl.sessions.injected import InjectedContext
from clawrl.sessions.messages import extend_hash, prefix_hashes
from clawrl.sessions.turn_type import SidePatterns, infer_turn_type
from clawrl.types import DEFAULT_USER, Message, NextStateMatch, TurnType

Source = Literal["header", "body", "affinity", "inferred"]


@dataclass(frozen=True)
class Hints:
    """What the request says about its session (headers or body fields)."""

    session_id: str | None = None
    source: Source = "inferred"
    turn_type: TurnType | None = None
    done: bool = False
    user: str = DEFAULT_USER  # whose request: inference matches only this user's sessions


@dataclass(frozen=True)
class Resolution:
    session_id: str
    source: Source
    is_new: bool
    turn_type: TurnType
    turn_index: int
    previous_turn_id: str | None  # the answer this request is the next state of
    next_state: list[Message] | None
    done: bool
    history: str  # hash of the request's messages
    history_len: int  # how many messages the request had
    taken_tip: Tip | None = None  # the tip this request consumed, for `abandon`
    user: str = DEFAULT_USER  # whose session
    next_state_match: NextStateMatch | None = None  # how `next_state` matched (None: no next state)


@dataclass(frozen=True)
class Tip:
    """A session's last main answer, waiting for its next state."""

    turn_id: str
    prompt: str  # hash of the request's messages (the conversation, without injected context)
    length: int  # how many messages: the request's, plus the answer
    answer: str  # hash of the request's messages plus the answer
    calls: tuple[str, ...]  # the names of the answer's tool calls


@dataclass
class _Session:
    id: str
    source: Source
    turn_count: int = 0
    tip: Tip | None = None
    last_active: float = 0.0
    user: str = DEFAULT_USER


@dataclass(frozen=True)
class Restored:
    """A session read back from the store after a restart."""

    session_id: str
    source: Source
    turn_count: int
    last_active: float
    last_turn_id: str | None = None
    messages: list[Message] = field(default_factory=list)  # the last main turn's request
    answer: Message | None = None  # and the answer it got
    user: str = DEFAULT_USER  # whose session


def _new_id() -> str:
    return f"sess-{uuid.uuid4().hex}"


class SessionTracker:
    def __init__(
        self,
        side_patterns: SidePatterns,
        idle_timeout: float,
        max_sessions: int,
        new_id: Callable[[], str] = _new_id,
        injected: InjectedContext | None = None,
    ) -> None:
        self._patterns = side_patterns
        self._injected = injected or InjectedContext([])
        self._idle = idle_timeout
        self._max = max_sessions
        self._new_id = new_id
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently active first
        self._by_tip: dict[str, list[str]] = {}
        self._evicted: list[tuple[str, str]] = []  # ended by the cap, reported by the next `expire`

    def __len__(self) -> int:
        return len(self._sessions)

    def resolve(self, messages: list[Message], hints: Hints, now: float) -> Resolution:
        messages = self._injected.conversation(messages)
        turn_type = infer_turn_type(hints.turn_type, messages, self._patterns)
        hashes = prefix_hashes(messages)
        session, cut, how = self._find(hints, messages, hashes)
        is_new = session is None
        if session is None:
            session = _Session(hints.session_id or self._new_id(), hints.source, user=hints.user)
            if hints.session_id or turn_type == "main":  # an unnamed side request has no future
                self._sessions[session.id] = session
                self._enforce_cap()
        next_state, taken = None, None
        if turn_type == "main" and session.tip is not None and how is not None:
            next_state = messages[cut:] if cut is not None else _after_last_answer(messages)
            if next_state:
                taken = self._take_tip(session)
        index = session.turn_count
        session.turn_count += 1
        self._touch(session, now)
        return Resolution(
            session_id=session.id,
            source=session.source,
            is_new=is_new,
            turn_type=turn_type,
            turn_index=index,
            previous_turn_id=taken.turn_id if taken else None,
            next_state=next_state or None,
            done=hints.done,
            history=hashes[-1],
            history_len=len(messages),
            taken_tip=taken,
            user=session.user,
            next_state_match=how if taken else None,
        )

    def answered(self, resolution: Resolution, turn_id: str, answer: Message, now: float) -> None:
        """A main turn was answered in full: its history plus answer becomes the session's tip."""
        session = self._sessions.get(resolution.session_id)
        if session is None or resolution.turn_type != "main":
            return
        self._drop_tip(session)
        self._set_tip(session, _tip(turn_id, resolution.history, resolution.history_len, answer))
        self._touch(session, now)

    def abandon(self, resolution: Resolution) -> None:
        """The request failed or was cancelled: give back the tip it took, if nothing replaced it."""
        session = self._sessions.get(resolution.session_id)
        if session is None or resolution.taken_tip is None or session.tip is not None:
            return
        session.tip = resolution.taken_tip
        self._by_tip.setdefault(session.tip.answer, []).insert(0, session.id)

    def end(self, session_id: str) -> bool:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._drop_tip(session)
        return session is not None

    def expire(self, now: float) -> list[tuple[str, str]]:
        """End sessions idle past the timeout, then the least recently active over the cap."""
        ended, self._evicted = self._evicted, []
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if oldest.last_active >= now - self._idle:
                break
            ended.append((oldest.id, "idle"))
            self.end(oldest.id)
        return ended

    def forget_user(self, user: str) -> list[str]:
        """Forget every open session of `user`'s (their data is being erased): nothing they sent is
        matched again, their next request opens a new session. Returns the sessions' ids."""
        ids = [sid for sid, session in self._sessions.items() if session.user == user]
        for sid in ids:
            self.end(sid)
        return ids

    def close_all(self) -> list[str]:
        """Forget every session (at shutdown); returns their ids."""
        ids = list(self._sessions)
        self._sessions.clear()
        self._by_tip.clear()
        return ids

    def _enforce_cap(self) -> None:
        while len(self._sessions) > self._max:
            oldest = next(iter(self._sessions))
            self._evicted.append((oldest, "evicted"))
            self.end(oldest)

    def restore(self, item: Restored) -> None:
        session = _Session(
            item.session_id, item.source, item.turn_count, last_active=item.last_active, user=item.user
        )
        self._sessions[session.id] = session
        self._sessions.move_to_end(session.id)
        messages = self._injected.conversation(item.messages)
        if item.last_turn_id and item.answer is not None and messages:
            prompt = prefix_hashes(messages)[-1]
            self._set_tip(session, _tip(item.last_turn_id, prompt, len(messages), item.answer))

    def _find(
        self, hints: Hints, messages: list[Message], hashes: list[str]
    ) -> tuple[_Session | None, int | None, NextStateMatch | None]:
        """The session; where the next state starts (None: after the last assistant message); how it
        matched (None: attach no next state)."""
        if not hints.session_id:
            inferred, cut = self._infer(hashes, hints.user)
            return inferred, cut, "history"
        session = self._sessions.get(hints.session_id)
        if session is not None and (cut := _continues(session, hashes)) is not None:
            return session, cut, "history"
        if hints.source == "affinity":  # an affinity key that does not continue its session
            inferred, cut = self._infer(hashes, hints.user)
            if inferred is not None:
                return inferred, cut, "history"
        if session is not None and (cut := _rewritten(session, messages, hashes)) is not None:
            return session, cut, "rewritten"
        return session, None, (None if hints.source == "affinity" else "named")

    def _infer(self, hashes: list[str], user: str) -> tuple[_Session | None, int | None]:
        """The user's session whose history plus last answer is the longest prefix of the request
        (another user's never: the same opening must not join two users' conversations)."""
        for k in range(len(hashes) - 1, 0, -1):  # the longest known history, shorter than the request
            waiting = [s for s in self._by_tip.get(hashes[k - 1], ()) if self._sessions[s].user == user]
            if waiting:
                return self._sessions[waiting[0]], k
        return None, None

    def _set_tip(self, session: _Session, tip: Tip) -> None:
        session.tip = tip
        self._by_tip.setdefault(tip.answer, []).append(session.id)

    def _take_tip(self, session: _Session) -> Tip | None:
        taken = session.tip
        self._drop_tip(session)
        session.tip = None
        return taken

    def _drop_tip(self, session: _Session) -> None:
        key = session.tip.answer if session.tip is not None else ""
        waiting = self._by_tip.get(key)
        if waiting and session.id in waiting:
            waiting.remove(session.id)
            if not waiting:
                del self._by_tip[key]

    def _touch(self, session: _Session, now: float) -> None:
        session.last_active = now
        if session.id in self._sessions:
            self._sessions.move_to_end(session.id)


def _tip(turn_id: str, prompt: str, prompt_len: int, answer: Message) -> Tip:
    return Tip(
        turn_id=turn_id,
        prompt=prompt,
        length=prompt_len + 1,
        answer=extend_hash(prompt, answer),
        calls=_call_names(answer),
    )


def _call_names(message: Message) -> tuple[str, ...]:
    return tuple(str(call.get("function", {}).get("name")) for call in message.get("tool_calls") or [])


def _continues(session: _Session, hashes: list[str]) -> int | None:
    """How many messages of the request are the session's history plus last answer, if it continues it."""
    tip = session.tip
    if tip is not None and 0 < tip.length < len(hashes) and hashes[tip.length - 1] == tip.answer:
        return tip.length
    return None


def _rewritten(session: _Session, messages: list[Message], hashes: list[str]) -> int | None:
    """How many messages of the request are the session's last main request plus, in the answer's place,
    an assistant message with other text but the same tool calls (a client's rewrite of the answer),
    if a user or tool message follows it."""
    tip = session.tip
    if tip is None or not 1 < tip.length < len(messages) or hashes[tip.length - 2] != tip.prompt:
        return None
    stand_in, after = messages[tip.length - 1], messages[tip.length]
    if stand_in.get("role") != "assistant" or _call_names(stand_in) != tip.calls:
        return None
    return tip.length if after.get("role") in ("user", "tool") else None


def _after_last_answer(messages: list[Message]) -> list[Message]:
    """For a named session whose history we cannot match: the messages after the last assistant one."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return [m for m in messages[last + 1 :] if m.get("role") in ("user", "tool")]
