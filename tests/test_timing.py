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


# --- a model that thinks first (issue 49): TTFT is the first token of any kind, TTFO the answer's ---------


def _stream(reasoning_field: str | None, n_thought: int = 3):
    import asyncio

    from evalkit.measure.client import stream_chat
    from evalkit.testing.stub_server import StubConfig, StubServer

    cfg = StubConfig(ttft_ms=20, itl_ms=15, fixed_chunks=4, reasoning_chunks=n_thought if reasoning_field else 0,
                     reasoning_field=reasoning_field or "reasoning_content")

    async def go(url: str):
        import aiohttp

        async with aiohttp.ClientSession() as http:
            return await stream_chat(http, f"{url}/v1/chat/completions",
                                     {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                                      "stream_options": {"include_usage": True}, "max_tokens": 8})

    with StubServer(cfg) as s:
        return asyncio.run(go(s.base_url))


@pytest.mark.integration
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_in_either_field_is_counted(field):
    assert _stream(field).reasoning_tokens == 3


@pytest.mark.integration
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_ttfo_minus_ttft_is_the_reasoning_time(field):
    r = _stream(field)
    assert r.ttfo_ms - r.ttft_ms == pytest.approx(r.reasoning_ms)


@pytest.mark.integration
def test_the_reasoning_time_is_about_its_tokens_gaps():
    assert _stream("reasoning").reasoning_ms >= 3 * 15 * 0.8  # three gaps of 15 ms before the answer


@pytest.mark.integration
def test_the_answer_text_holds_no_reasoning():
    assert "step" not in _stream("reasoning_content").text


@pytest.mark.integration
def test_the_reasoning_text_is_kept_apart():
    assert _stream("reasoning").reasoning.startswith("step 0.")


@pytest.mark.integration
def test_tpot_counts_reasoning_and_answer_tokens():
    r = _stream("reasoning")
    assert r.completion_tokens == 3 + 4


@pytest.mark.integration
@pytest.mark.parametrize("attr", ["reasoning_tokens", "reasoning_ms"])
def test_a_model_that_does_not_reason_has_no_reasoning(attr):
    assert getattr(_stream(None), attr) is None


@pytest.mark.integration
def test_without_reasoning_ttfo_is_ttft():
    r = _stream(None)
    assert r.ttfo_ms == r.ttft_ms


@pytest.mark.parametrize("attr, ms", [("ttft_ms", 100.0), ("ttfo_ms", 300.0), ("reasoning_ms", 200.0)])
def test_the_parser_times_a_reasoning_chunk_as_the_first_token(attr, ms):
    from evalkit.measure.client import RequestResult, StreamParser

    res = RequestResult(started_at="t")
    p = StreamParser(res, 0.0)
    p.feed(b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n', 0.005)
    p.feed(b'data: {"choices": [{"delta": {"reasoning": "hmm"}}]}\n\n', 0.100)
    p.feed(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n\n', 0.300)
    p.finish(0.4)
    assert getattr(res, attr) == pytest.approx(ms)
