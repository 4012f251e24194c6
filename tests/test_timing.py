"""Each client metric definition (docs/timing.md) pinned on recorded chunk timings."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from evalkit.measure import timing
from evalkit.measure.client import build_payload, stream_chat
from evalkit.testing.stub_server import StubConfig, StubServer


def test_definitions_on_recorded_offsets():
    offsets = [900.0, 950.0, 1010.0, 1050.0]  # content-bearing chunk arrivals, ms after send
    assert timing.ttft_ms(offsets) == 900.0
    assert timing.itl_ms(offsets) == [50.0, 60.0, 40.0]  # TTFT is not an inter-token gap
    assert timing.itl_mean_ms(offsets) == pytest.approx(50.0)
    # TPOT = (E2E - TTFT) / (tokens - 1)
    assert timing.tpot_ms(1100.0, 900.0, 5) == pytest.approx(50.0)
    assert timing.tpot_ms(1100.0, 900.0, 1) is None
    assert timing.output_tps(2000.0, 100) == pytest.approx(50.0)
    assert timing.ttft_ms([]) is None
    assert timing.itl_mean_ms([900.0]) is None


def _run(cfg: StubConfig, **kw) -> object:
    async def go():
        with StubServer(cfg) as s:
            async with aiohttp.ClientSession() as session:
                payload = build_payload("stub-model", [{"role": "user", "content": "hi there"}],
                                        max_tokens=16, temperature=0.0, seed=1, **kw)
                return await stream_chat(session, f"{s.base_url}/v1/chat/completions", payload)

    return asyncio.run(go())


@pytest.mark.integration
def test_ttft_skips_the_role_only_first_chunk():
    # The stub sends {"role": "assistant", "content": ""} at once, then waits ttft_ms.
    r = _run(StubConfig(ttft_ms=200, itl_ms=1))
    assert r.ok
    assert r.ttft_ms is not None
    assert r.ttft_ms >= 195, r.ttft_ms  # not the ~1 ms of the role-only chunk
    assert r.e2e_ms >= r.ttft_ms
    assert r.n_chunks > len(r.chunk_offsets_ms)  # role + finish + usage chunks carry no content


@pytest.mark.integration
def test_usage_comes_from_the_stream_and_text_is_whole():
    r = _run(StubConfig(ttft_ms=1, itl_ms=1, chars_per_chunk=5))
    assert r.usage_source == "stream_usage"
    assert r.completion_tokens == len(r.chunk_offsets_ms)
    assert r.prompt_tokens == 2
    assert r.finish_reason == "stop"
    assert r.text.startswith("This is a stub reply")
    assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / (r.completion_tokens - 1))


@pytest.mark.integration
def test_structured_output_payload_and_reply():
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 3}}, "required": ["a"]}
    payload = build_payload("m", [], max_tokens=8, temperature=0, seed=None, schema_name="x", schema=schema)
    assert payload["response_format"]["json_schema"] == {"name": "x", "schema": schema, "strict": True}
    assert payload["stream_options"] == {"include_usage": True}
    assert "seed" not in payload
    import json

    r = _run(StubConfig(ttft_ms=1, itl_ms=0), schema_name="x", schema=schema)
    assert len(json.loads(r.text)["a"]) >= 3
