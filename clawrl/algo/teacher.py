"""The teacher's view of a turn: the same conversation with the hindsight hint added.

On-policy distillation scores the turn's own response token IDs under two
prompts: the original one (the student, logp_old) and this enhanced one (the
teacher). The enhanced prompt is the original messages with the hint appended
to the last user message, rendered by the same chat template with the same
tools and the same template variables (`Turn.chat_template_kwargs`: a Qwen3 turn served with
`enable_thinking` false keeps its empty think block), so the two prompts differ only inside that
message.

Placement:
* string content: `content + "\\n\\n" + HINT_PREFIX + hint` (just
  `HINT_PREFIX + hint` when the content is empty or None);
* a list of text parts: a new text part `"\\n" + HINT_PREFIX + hint` is
  appended; the renderer joins parts with "\\n", so this renders exactly as the
  string case does;
* no user message at all (e.g. a system prompt and tool results only): a new
  user message with just `HINT_PREFIX + hint` is appended at the end, so the
  hint still comes right before the assistant's generation prompt.

With `train.hint_placement` "follow_up" the hint is not added to the user's message: the
teacher prompt is the conversation as it went on, the served messages, the turn's own answer as
the assistant's message and the hint as the user's next message (`follow_up_messages`), so the
teacher is the policy answering again after being told what was wrong. On the embedded model a
request made that way is followed where the same words inside the question are not (greedy
answers ending on "Hope that helps!": 8 of 16 after the follow-up, 0 of 16 with the hint
appended; `bench/hint_follow.py --greedy`), but followed as a reply to the request, and learning
runs with it gained nothing on that preference and less than the default on another
(docs/evaluation.md, issue 53's fifth session): not the default.

A turn whose prompt carried a memory block (`Turn.memory`, clawrl/memory) gets the same block
in its enhanced prompt, so the two prompts still differ only by the hint. `bare_prompt` renders
the client's messages alone: the student prompt of memory distillation (clawrl/algo/distill.py).

Deviation from the original: the tool_choice of the request is not kept on a
`Turn`, so the enhanced prompt is rendered with tool_choice None; a turn made
under "none", "required" or a named function gets a teacher prompt with the
tools offered and without the forced prefix.
"""

from __future__ import annotations

from collections.abc import Callable

from clawrl.algo.base import TeacherPrompt
from clawrl.chat.template import ChatRenderer
from clawrl.memory import with_memory
from clawrl.types import HintPlacement, Message, Turn

HINT_PREFIX = "[Hindsight hint] "
# How a next-state hint (clawrl/judge/likelihood.py) says where it came from; a follow-up teacher
# prompt gives the user's reply as the user's own message, without it.
HINT_INTRO = {
    "user": "After a first answer to this, the user replied: ",
    "tool": "A first attempt at this got from the tool: ",
}


def enhanced_messages(messages: list[Message], hint: str) -> list[Message]:
    """A copy of `messages` with the hint appended to the last user message (inputs untouched)."""
    enhanced = [dict(message) for message in messages]
    users = [i for i, message in enumerate(enhanced) if message.get("role") == "user"]
    if not users:
        return [*enhanced, {"role": "user", "content": HINT_PREFIX + hint}]
    last = enhanced[users[-1]]
    content = last.get("content")
    if isinstance(content, list):
        last["content"] = [*content, {"type": "text", "text": "\n" + HINT_PREFIX + hint}]
    else:
        last["content"] = (content + "\n\n" if content else "") + HINT_PREFIX + hint
    return enhanced


def follow_up_messages(messages: list[Message], answer: Message, hint: str) -> list[Message]:
    """`messages`, the answer (an assistant message), and the hint as the user's next message (a
    next-state hint from a user's reply without its framing: the user's own words)."""
    return [*messages, answer, {"role": "user", "content": hint.removeprefix(HINT_INTRO["user"])}]


def answer_message(turn: Turn) -> Message:
    """The turn's answer as the assistant message a client would send back."""
    answer: Message = {"role": "assistant", "content": turn.response_text}
    if turn.tool_calls:
        answer["tool_calls"] = turn.tool_calls
    return answer


def served_messages(turn: Turn) -> list[Message]:
    """The messages the turn's prompt was rendered from: the client's, with its memory block if any."""
    block = (turn.memory or {}).get("block")
    return with_memory(turn.messages, block) if block else turn.messages


def teacher_prompt(renderer: ChatRenderer, placement: HintPlacement = "append") -> TeacherPrompt:
    """The function rendering a turn's enhanced prompt to IDs with the turn's tools: the hint
    appended to the last user message, or (`placement` "follow_up") the user's next message."""

    def render(turn: Turn, hint: str) -> list[int]:
        served = served_messages(turn)
        if placement == "follow_up":
            messages = follow_up_messages(served, answer_message(turn), hint)
        else:
            messages = enhanced_messages(served, hint)
        return renderer.render(messages, turn.tools, template_kwargs=turn.chat_template_kwargs).prompt_ids

    return render


def bare_prompt(renderer: ChatRenderer) -> Callable[[Turn], list[int]]:
    """The function rendering a turn's client messages alone (no memory block) with its tools: the
    student prompt of memory distillation (clawrl/algo/distill.py)."""

    def render(turn: Turn) -> list[int]:
        kwargs = turn.chat_template_kwargs
        return renderer.render(turn.messages, turn.tools, template_kwargs=kwargs).prompt_ids

    return render
