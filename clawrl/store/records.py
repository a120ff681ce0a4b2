"""The store seen from outside: one JSON line per turn, and one session shown for a human.

`export` writes what a training or analysis script needs for each turn: the
exact token IDs and logprobs, the messages and tools, the next state and how it was
matched to the answer (`next_state_match`; `show` says so when the client resent the
answer rewritten), explicit feedback and the latest judgment: its score, hint, judge
and every vote (kind, value, raw text, hint, latency, error); `reward` is the score.
Lines are UTF-8 (`ensure_ascii=False`) and in store order: by creation time, or by
index within one session. `show` prints one session turn by turn, text clipped.
A thinking answer has its `reasoning` beside `response` (the content; `response_ids` hold both,
tags included: clawrl/chat/reasoning.py), and `show` prints it clipped above the answer.
A turn whose prompt carried a memory block has `memory` (the experience ids and the block, or
why it was dropped; docs/memory.md), and `show` prints it under the turn with each experience's
text. A turn of a Track 2 episode carries its `episode` (group, reward, how it ended);
`episodes` prints the latest episodes, one line each. Under a turn, `show` lists its samples the
trainer left out (`stale`, `skipped`) with their reason, and any that were in a failed training
step (clawrl/train/failures.py) with the count.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from clawrl.store.db import Store, StoreError
from clawrl.types import DEFAULT_USER, Episode, Judgment, Message, Sample, Turn, Vote

JUDGMENT_KEYS = ("score", "votes", "hint", "judge")
CLIP = 300  # characters of a prompt or next-state message that `show` prints


def record(
    store: Store, turn: Turn, episode: Episode | None = None, user: str = DEFAULT_USER
) -> dict[str, Any]:
    """One export line: the turn, its user (docs/users.md), its feedback, its latest judgment and its
    session's episode."""
    judgment = store.judgment_for(turn.id)
    return {
        "id": turn.id,
        "user": user,
        "session_id": turn.session_id,
        "turn": turn.index,
        "turn_type": turn.turn_type,
        "messages": turn.messages,
        "tools": turn.tools,
        "response": turn.response_text,
        "reasoning": turn.reasoning,
        "tool_calls": turn.tool_calls,
        "prompt_ids": turn.prompt_ids,
        "response_ids": turn.response_ids,
        "logprobs": turn.logprobs,
        "policy_version": turn.policy_version,
        "versions": turn.versions,
        "temperature": turn.temperature,
        "sampling": turn.sampling,
        "finish_reason": turn.finish_reason,
        "next_state": turn.next_state,
        "next_state_at": turn.next_state_at,
        "next_state_match": turn.next_state_match,
        "feedback": [
            {"rating": fb.rating, "comment": fb.comment, "created_at": fb.created_at}
            for fb in store.feedback_for(turn.id)
        ],
        "judgment": None if judgment is None else {k: judgment[k] for k in JUDGMENT_KEYS},
        "reward": None if judgment is None else judgment["score"],
        "episode": None if episode is None else _episode(episode),
        "memory": turn.memory,
        "created_at": turn.created_at,
        "first_token_at": turn.first_token_at,
        "finished_at": turn.finished_at,
    }


def export(store: Store, out: TextIO, session_id: str | None = None, user: str | None = None) -> int:
    """Write one JSON line per turn (all, one session's, or one user's) to `out`; return how many."""
    count = 0
    sessions: dict[str, tuple[Episode | None, str]] = {}
    for turn in store.turns(session_id):
        if turn.session_id not in sessions:
            whose = store.session_user(turn.session_id) or DEFAULT_USER
            sessions[turn.session_id] = (store.session_episode(turn.session_id), whose)
        episode, whose = sessions[turn.session_id]
        if user is not None and whose != user:
            continue
        out.write(json.dumps(record(store, turn, episode, whose), ensure_ascii=False) + "\n")
        count += 1
    return count


def episodes(store: Store, out: TextIO, limit: int = 50) -> int:
    """Print the latest episodes (newest first) with their group, reward and tool calls; return how many."""
    shown = store.recent_episodes(limit)
    for e in shown:
        reward = "dropped" if e.reward is None else f"reward {e.reward:g}"
        out.write(
            f"{e.session_id}  group {e.group_id} ({e.group_size})  {reward}  {e.reason or ''}  "
            f"{e.turns} turns, {e.tool_calls} tool calls  {e.env or ''} {e.task or ''}".rstrip()
            + "\n"
        )
    return len(shown)


def _episode(e: Episode) -> dict[str, Any]:
    group = {"group_id": e.group_id, "group_size": e.group_size, "reward": e.reward, "reason": e.reason}
    return group | {
        "env": e.env,
        "task": e.task,
        "turns": e.turns,
        "tool_calls": e.tool_calls,
        "train": e.train,
    }


def show(store: Store, session_id: str, out: TextIO) -> None:
    """Print one session for a human. StoreError if the store has no such session."""
    if not store.session_exists(session_id):
        raise StoreError(f"no session {session_id!r} in {store.path}")
    turns = list(store.turns(session_id))
    out.write(f"session {session_id}: {len(turns)} turn{'' if len(turns) == 1 else 's'}\n")
    episode = store.session_episode(session_id)
    if episode is not None:
        reward = "dropped" if episode.reward is None else f"reward {episode.reward:g}"
        group = store.group(episode.group_id)
        verdict = (
            f", group {group.status}" + (f" ({group.reason})" if group and group.reason else "")
            if group
            else ""
        )
        out.write(f"episode of group {episode.group_id}: {reward} ({episode.reason or '-'}){verdict}\n")
    for turn in turns:
        out.write("\n" + "\n".join(_turn_lines(store, turn)) + "\n")


_MATCHED = {  # how the next state was matched, where a reader should know (NextStateMatch)
    "rewritten": " (the client resent this answer rewritten; matched by the request before it)",
    "named": " (the session named, its history changed: what followed the last answer)",
}


def _turn_lines(store: Store, turn: Turn) -> list[str]:
    lines = [
        f"[{turn.index}] {turn.turn_type}  {turn.policy_version}  finish: {turn.finish_reason}  id: {turn.id}"
    ]
    prompt = _last_input(turn.messages)
    if prompt is not None:
        lines.append(f"  prompt ({prompt['role']}): {_clip(_text(prompt.get('content')))}")
    if turn.reasoning:
        lines.append(f"  reasoning: {_clip(turn.reasoning)}")
    lines.append("  answer: " + (turn.response_text or "(none)").replace("\n", "\n          "))
    lines += [f"  tool call: {_call(call)}" for call in turn.tool_calls]
    if turn.next_state is None:
        lines.append("  next state: (none)")
    else:
        lines.append("  next state:" + _MATCHED.get(turn.next_state_match or "", ""))
        lines += [f"    {m.get('role', '?')}: {_clip(_text(m.get('content')))}" for m in turn.next_state]
    lines += _memory_lines(store, turn.memory)
    if older := (turn.sampling or {}).get("prefix_kv_version"):
        lines.append(f"  prompt prefix: KV computed by {older} (the prefix cache, across a swap)")
    lines += [_feedback_line(fb.rating, fb.comment) for fb in store.feedback_for(turn.id)]
    judgment = store.latest_judgment(turn.id)
    if judgment is not None:
        lines += _judgment_lines(judgment)
    lines += [_sample_line(s, why) for s, why in store.turn_samples(turn.id) if why or s.attempts]
    return lines


def _sample_line(s: Sample, why: str | None) -> str:
    """A sample the trainer left out, or that was in a failed step: `sample 7 (rl, made by v0):
    skipped: failed step: ValueError: ... (2 failed steps)`."""
    failed = f" ({s.attempts} failed step{'' if s.attempts == 1 else 's'})" if s.attempts else ""
    return f"  sample {s.id} ({s.kind}, made by {s.version}): {s.status}{': ' + why if why else ''}{failed}"


def _memory_lines(store: Store, memory: dict[str, Any] | None) -> list[str]:
    """What memory added to the turn's system prompt: each experience by id and text, or the drop."""
    if memory is None:
        return []
    if memory.get("dropped"):
        picked = ", ".join(f"#{i}" for i in memory.get("picked", []))
        return [f"  memory: dropped ({memory['dropped']}){': ' + picked if picked else ''}"]
    lines = ["  memory:"]
    for i in memory.get("ids", []):
        e = store.experience(i)
        lines.append(f"    #{i} {_clip(e.text) if e is not None else '(not in this store)'}")
    return lines


def _judgment_lines(j: Judgment) -> list[str]:
    votes = ", ".join(map(_vote, j.votes)) or "none"
    lines = [f"  judgment: score {j.score}  votes {votes}  by {j.judge}"]
    if j.hint:
        lines.append(f"  hint: {_clip(j.hint)}")
    return lines


def _vote(vote: Vote) -> str:
    """`prm +1`, or `hint failed (timeout)` for a vote that failed."""
    if vote.value is None:
        return f"{vote.kind} failed ({_clip(vote.error or 'no reason', 60)})"
    return f"{vote.kind} {vote.value:+d}"


def _last_input(messages: list[Message]) -> Message | None:
    """The user or tool message the answer replies to."""
    return next((m for m in reversed(messages) if m.get("role") in ("user", "tool")), None)


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    return " ".join(
        p.get("text", f"[{p.get('type', '?')}]") if isinstance(p, dict) else str(p) for p in parts
    )


def _clip(text: str, limit: int = CLIP) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _call(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    return f"{fn.get('name', '?')}({_clip(str(fn.get('arguments', '')), 200)})"


def _feedback_line(rating: int, comment: str | None) -> str:
    sign = f"{rating:+d}"
    return f"  feedback: {sign}" + (f"  {_clip(comment)}" if comment else "")
