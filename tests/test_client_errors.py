"""Every failure comes back as a result with an error class (the runner stores it as a row)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from evalkit.engines.vllm_server import free_port
from evalkit.measure.client import build_payload, stream_chat
from evalkit.testing.stub_server import StubConfig, StubServer


def _send(url: str, timeout_s: float = 10.0, headers: dict | None = None):
    async def go():
        async with aiohttp.ClientSession() as session:
            payload = build_payload("stub-model", [{"role": "user", "content": "x"}], max_tokens=8,
                                    temperature=0, seed=1)
            return await stream_chat(session, url, payload, headers=headers, timeout_s=timeout_s)

    return asyncio.run(go())


@pytest.mark.parametrize(
    "fault, error_class",
    [("http_500", "http_500"), ("http_503", "http_503"), ("http_429", "http_429"),
     ("cut", "stream_cut"), ("empty", "empty_completion")],
)
@pytest.mark.integration
def test_faults_become_error_classes(fault: str, error_class: str):
    with StubServer(StubConfig(fault=fault, itl_ms=0, ttft_ms=0)) as s:
        r = _send(f"{s.base_url}/v1/chat/completions")
    assert r.error_class == error_class, (r.error_class, r.error)
    assert r.e2e_ms is not None


@pytest.mark.integration
def test_malformed_lines_are_counted_and_content_kept():
    with StubServer(StubConfig(fault="malformed", itl_ms=0, ttft_ms=0)) as s:
        r = _send(f"{s.base_url}/v1/chat/completions")
    assert r.ok
    assert r.n_malformed == 2
    assert r.text.startswith("This is a stub")


def test_connection_refused():
    r = _send(f"http://127.0.0.1:{free_port()}/v1/chat/completions")
    assert r.error_class == "connect_error"
    assert r.http_status is None


@pytest.mark.integration
def test_stall_after_first_token_times_out():
    with StubServer(StubConfig(fault="stall", itl_ms=0, ttft_ms=0)) as s:
        r = _send(f"{s.base_url}/v1/chat/completions", timeout_s=0.5)
    assert r.error_class == "timeout"
    assert r.ttft_ms is not None
    assert r.text  # what was received is kept
