"""evalkit: a repeatable evaluation matrix for LLM variants served by vLLM.

Packages by concern, data flowing one way (docs/architecture.md):
spec (inputs) → execution (runs, using engines and measure) → ledger (SQLite) → grading →
reporting → sharing; `cli` parses and prints.
"""

__version__ = "0.3.0"
