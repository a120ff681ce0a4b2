"""Agents in environments (Track 2): episodes run through the server's own `/v1`, rewards posted.

An environment is a class in TRL's `environment_factory` contract (docs/environments.md):
built with no arguments, `reset(**task_row)`, its public methods are tools, and
`get_reward()` (or a TRL reward function) scores the episode. An episode is one session
(`X-Session-Id`), tool results go back as `tool` messages (the next states of the
tool-call turns), and the reward is posted to `POST /v1/episodes` with its group; the
server's grpo method turns complete groups into samples.

    errors       the exceptions that stop `clawrl envs` (exit 2)
    load         environment classes (FILE.py:Class, module:Class, SHIPPED names), reward
                 functions, JSONL tasks; the probe that checks the contract at start
    tools        which methods are tools, their JSON schemas, calling them with a timeout
    schedule     the per-turn tool_choice schedule (`--tool-choice calculate,submit`)
    episode      one episode: reset, answer, run the tools, until done or a limit; its reward
    client       the HTTP client (clawrl.client's, shared with eval): chat completions,
                 POST /v1/episodes, /healthz
    groups       G episodes of one task, K in flight, each posted when it ends
    training     `envs train`'s loop: groups until the server has published N new versions
    stats        figures per version (pure); report: report.json / .md / episodes.jsonl; plot
    run          `envs train` / `envs eval`: the plan, the servers, the report
    commands     the argparse side of `clawrl envs`
    harbor/      Harbor task folders as environments: a bash tool in a bubblewrap sandbox
    shipped/     the environments clawrl ships (calculator, bfcl, Harbor sets), listed in its
                 `SHIPPED`: what `--env NAME` finds; nothing in the runner is theirs
"""
