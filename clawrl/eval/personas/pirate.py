"""`pirate`: every answer must start with the exact word "Ahoy!".

Why this one: SmolLM2-135M-Instruct (the embedded model) essentially never opens an
answer with "Ahoy!" by itself, and the opening message never asks for it. Binary RL
learns only from the model's own samples, so with almost no sample that meets the
preference it sees a wall of -1 rewards and no direction. The hindsight hint
('Begin the answer with the exact word "Ahoy!"') does give one: under the hinted
prompt the teacher puts high probability on "Ahoy" as the first token, and on-policy
distillation pushes the policy there token by token. Learning this persona is therefore
evidence that the OPD path works, and a control for methods without hints.

The preference is about the marker only, not correctness, so the signal stays clean:
1.0 when the answer starts with "Ahoy!", 0.5 when "ahoy" appears anywhere else, else 0.
"""

from __future__ import annotations

from clawrl.eval.personas.base import Check, RulePersona
from clawrl.eval.tasks import Task

MARKER = "Ahoy!"


class Pirate(RulePersona):
    name = "pirate"
    description = (
        "A user who runs a pirate-themed maths club and wants every answer to start with "
        f'the exact word "{MARKER}" as its very first word.'
    )
    openings = (
        "Here's one for the crew: {question}",
        "Our club is stuck on this: {question}",
        "{question} Can you help us out?",
    )
    thanks = ("Ahoy to you too, that's perfect.", "Thanks, that's perfect.")

    def checks(self, task: Task, answer: str) -> list[Check]:
        hint = f'Begin the answer with the exact word "{MARKER}".'
        if answer.lstrip().startswith(MARKER):
            return [Check(1.0, "", hint)]
        if MARKER.rstrip("!").lower() in answer.lower():
            return [
                Check(
                    0.5,
                    f'Put "{MARKER}" at the very start, as the first word of your answer, not later on.',
                    hint,
                )
            ]
        return [
            Check(
                0.0,
                f'Please start every answer with "{MARKER}", that exact word, as the very first thing.',
                hint,
            )
        ]
