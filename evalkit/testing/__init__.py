"""Test doubles that speak real protocols: a fast OpenAI-compatible streaming stub server for
unit tests and client benchmarks. Never a stand-in for vLLM in an evaluation run.

May import: the root modules, and `engines` (to size a cache the way vLLM does).
"""
