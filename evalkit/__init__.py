"""evalkit: a repeatable evaluation matrix for LLM variants served by vLLM."""

__version__ = "0.1.0"
