"""What stops `clawrl envs`, each with a message for the user (the command exits 2).

    EnvsError(RuntimeError)   base
    ├── EnvLoadError          the environment or the reward function cannot be imported or built
    ├── TaskError             the tasks cannot be read (no file, not JSONL, a row without a prompt)
    └── ServerError           the server cannot be reached, or refused a request the run cannot do without

What goes wrong inside one episode (a tool that raises or hangs, a row that does not fit
`reset`, a reward that is not a number) is no exception here: the episode is dropped, its
reason recorded, and the run goes on (clawrl/envs/episode.py).
"""

from __future__ import annotations


class EnvsError(RuntimeError):
    """`clawrl envs` cannot go on; the message says why."""


class EnvLoadError(EnvsError):
    """The environment or the reward function cannot be imported or built."""


class TaskError(EnvsError):
    """The tasks cannot be read."""


class ServerError(EnvsError):
    """The server cannot be reached, or refused a request the run needs."""
