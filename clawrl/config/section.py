"""The base of every config section: unknown keys are errors, assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

API_KEY_ENV = "CLAWRL_API_KEY"
JUDGE_KEY_ENV = "CLAWRL_JUDGE_API_KEY"
CACHE_ENV = "CLAWRL_CACHE_DIR"
VLLM_KEY_ENV = "CLAWRL_VLLM_API_KEY"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
