"""What a request that names no sampling parameter samples with: the model's defaults.

`clawrl.model.load.generation_defaults` reads them from a model folder's
`generation_config.json`; both engines apply them, and `/v1/models` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that names no temperature, top_p, top_k or penalty samples with: the model
    folder's generation config (`clawrl.model.load.generation_defaults`), else these values.
    `top_k` 0, `repetition_penalty` 1 and the other penalties 0: off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    source: str = "clawrl"  # where they came from: "clawrl" (no generation config) or the file


CLAWRL_SAMPLING = SamplingDefaults()  # a model folder that names none gets these
