"""The `divergence:` section of a matrix: teacher-forced scoring of the baseline's answers on every
variant's server (the divergence grader; docs/measuring.md, "Token-level divergence")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Divergence(BaseModel):
    """While each variant's server is up, the baseline's answer to every case is scored on it,
    teacher-forced (`prompt_logprobs`): one scoring request per case and variant, no generation,
    plus the baseline's own floor pass. Off, no scoring request is sent and the grader has nothing
    to grade."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="score the baseline's answers teacher-forced on every variant's server")
    top_k: int = Field(20, ge=1, le=1000, description="log-probabilities per answer token (vLLM's --max-logprobs, 20 "
                                                      "by default, caps it: raise both together)")
    floor_concurrency: int = Field(4, ge=2, le=64, description="the baseline's floor pass scores its answers this many "
                                                               "at once: what batching alone changes")
    greedy_regen: bool = Field(True, description="at temperature 0, also regenerate the baseline's answers batched "
                                                 "(floor_concurrency at once): the floor of greedy identity and drift")
