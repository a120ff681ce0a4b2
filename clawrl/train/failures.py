"""A training step that fails: what it counts against its samples, and how batches keep the
samples that failed before apart, so that one sample that makes every step fail cannot stall
learning (a poison batch).

Before: a step that raised handed its claims back, the supervisor restarted the trainer, the
oldest-first rule picked the same batch, and it failed again, for good, while serving went on.

Now (clawrl/train/loop.py):

- A step that runs out of GPU memory (`torch.OutOfMemoryError`, which `torch.cuda`'s is) is
  retried once, alone on its rank, after the cache is freed: each micro-batch split in halves and
  no session packing (`Trainer.step(split=True)`), the same samples and the same update at about
  half the activations a pass. Only a retry that fails too counts as a failure.
- A step that raises counts one failed attempt for each sample of its batch, in the store
  (`samples.attempts`, m020), and re-raises: the trainer exits and the supervisor restarts it, with
  a fresh process (a CUDA error can leave the context unusable, so going on in place could fail
  every later step and skip innocent samples). The count survives the restart.
- A sample at its `MAX_FAILURES`-th (2nd) failed step is `skipped`, its reason the exception's
  class and message (`failed step: ValueError: ...`: counted as `failed step` on /metrics and the
  dashboard, shown by `clawrl records show`); the batch's other samples go back to `ready`.
- `pick`: a batch holds at most one sample that failed before, with untried ones (oldest first
  otherwise). A poison sample's second failure is then its own, and the samples that shared its
  first batch are each tried again beside untried ones: learning goes on with them. Two poison
  samples in one batch can still cost an untried companion its second failure; a suspect waits
  for untried samples to be batched with.

A failure of the canary or the publish is not the batch's: its claims go back uncounted, as before.
Nor is a failure in a group of ranks (`train.distributed`) counted: there rank 0's error is as
often a peer's death seen in a collective (a killed rank) as the batch's own, so a group still
hands the batch back uncounted and is restarted, as before (not solved for groups yet).
"""

from __future__ import annotations

from clawrl.types import Sample

MAX_FAILURES = 2  # the failed steps after which a sample is skipped
REASON_CHARS = 300  # of the exception's message, in the reason (an OOM message is long)


def failure_reason(exc: BaseException) -> str:
    """`failed step: <class>: <message>` (the message on one line, clipped): the skip reason."""
    message = " ".join(str(exc).split())
    if len(message) > REASON_CHARS:
        message = message[: REASON_CHARS - 1] + "…"
    return f"failed step: {type(exc).__name__}: {message or '(no message)'}"


def pick(usable: list[Sample], n: int) -> list[Sample]:
    """The oldest `n` of `usable` (oldest first) with at most one that failed a step before;
    fewer when there are not enough untried ones (the loop waits)."""
    out: list[Sample] = []
    suspect = False
    for s in usable:
        if len(out) == n:
            break
        if s.attempts:
            if suspect:
                continue
            suspect = True
        out.append(s)
    return out
