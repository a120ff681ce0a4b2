"""The collect loop: every answer becomes a turn in the store, and the next message its next state.

`Collector` resolves each request's session with the pure `clawrl.sessions.SessionTracker`,
writes turns, next states, feedback and ended sessions through one writer thread, and tells
the judge (any object with `submit` and `session_ended`, given to its constructor) when a
turn can be judged. See docs/design.md, "One turn's life".
"""
