"""Evaluation with simulated users: does the served model learn what its users want?

`clawrl eval` serves each task to a persona through the real API, feeds the persona's
replies back as the next state (and its ratings as explicit feedback), and measures the
persona's score on held-out tasks at v0 and after every training step.

    tasks        problems with known answers, and the train / held-out split
    personas/    scripted users (student, teacher, brief, pirate); llm_persona: played by a model
    client       the OpenAI-API client the users talk through (httpx; nothing private)
    server       a fresh `clawrl serve` subprocess per method
    pacing       how many ratings the users may send per training step
    scenario     measurement and the users' training conversations
    experiment   one method's loop: measure, train until a new version, measure again
    report       report.json / report.md (pure); plot: the PNGs
    panel        the report's collapse panel: the canary's collapse figures, held-out self-ROUGE-L (pure)
    history      a run folder's rewards and hint acceptance, for `clawrl report`
    run          `clawrl eval`; commands: the argparse side of `eval` and `report`
"""
