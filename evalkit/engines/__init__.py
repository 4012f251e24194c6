"""Serving engines: launching a real vLLM server per variant (its own process group, stopped
whole), what a checkpoint is (quantization, dtype, weight bytes), the memory budget that turns
weights into KV-cache blocks, the bundled SmolLM2 models prepared on first use, and the AVX2
emulation shim.

May import: the root modules, `spec`.
"""
