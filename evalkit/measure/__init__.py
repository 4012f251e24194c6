"""Measuring one request and one server: the streaming HTTP client (kernel receive timestamps
where the platform gives them), the client-timing definitions (TTFT, ITL, TPOT, E2E), token
counts without a usage chunk, the event-loop lag probe, and the vLLM /metrics scraper with its
per-request attribution.

May import: the root modules, `spec`, `ledger`. Knows nothing of runs, load or grading.
"""
