"""The judge: what the next state says about each answer.

prompts.py        the chat messages sent to the judge model (templates in prompts/*.txt)
prompts/prm.txt   process reward: was the answer good, judging by what followed it (-1 / 0 / +1)
prompts/hint.txt  hindsight hint: what the answer should have done, as an instruction
parse.py          reading a judge reply: the last \\boxed{...} score, the [HINT_START] block
votes.py          replies to votes, votes to a Judgment (majority, longest hint, feedback first)
backends.py       where judge calls go: an OpenAI-compatible endpoint or the server's own engine
worker.py         the judge loop: queued turns -> votes -> judgments and samples in the store

prompts, parse and votes are pure; the IO (backends, worker) passes replies, or failures,
to `votes.prm_vote` / `votes.hint_vote`.
"""
