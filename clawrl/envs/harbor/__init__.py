"""Harbor task folders as environments: a shell in a bubblewrap sandbox, the task's verifier as reward.

    --env harbor:PATH            PATH is a folder of Harbor task folders (or one task folder)

A task folder (Harbor's format, as Terminal-Bench 2 publishes it):

    instruction.md               what the agent is asked (the episode's prompt)
    task.toml                    [verifier] timeout_sec, [agent] timeout_sec,
                                 [environment] cpus / memory_mb (or memory = "2G") / allow_internet
    environment/Dockerfile       its WORKDIR and COPY lines place the task's files (below)
    tests/test.sh                the verifier: writes /logs/verifier/reward.txt (a number)
                                 or reward.json ({"reward": x})
    solution/solve.sh            optional: the reference solution (`clawrl envs check`)

No container runtime is used: each episode gets a fresh copy of the task's files in a
workspace folder, mounted at the Dockerfile's WORKDIR (default /app) inside a bubblewrap
sandbox (`sandbox.py`: no network, the system read-only, a private /tmp, limits on wall
time, CPU time, memory, processes, file and output size). Of the Dockerfile only `WORKDIR`,
`COPY`/`ADD` of local files into the WORKDIR and `ENV` are carried out; every other step
(`RUN apt-get ...`, `pip install`) is skipped with a warning naming it, as OpenEnv's local
mode does: a task that needs them fails its verifier here, and `clawrl envs check` shows it.

Files: `task.py` (reading a task folder; a bad one is refused with its path and reason),
`sandbox.py` (bwrap), `env.py` (`HarborEnv`, TRL's environment contract: a `bash` tool, the
verifier as `get_reward`), `check.py` (`clawrl envs check`). The project's own task sets
are `clawrl/envs/shipped/harbor_sets/`. The `harbor` package itself is not used (it needs Python 3.12).
"""
