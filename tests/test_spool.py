"""A trace's cases stay on disk (`spec.spool.SpooledCases`): read back equal, counted and indexed
like a list, passes that nest, the file gone with the object; `trace_cases` spools them."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

from evalkit.execution.traces import TraceSpec, trace_cases
from evalkit.spec.dataset import Case, Message
from evalkit.spec.matrix import Matrix
from evalkit.spec.spool import SpooledCases


def _cases(n: int) -> list[Case]:
    out = []
    for i in range(n):
        c = Case(id=f"c{i}", messages=[Message(role="user", content=f"write {i} — ünïcode\ttab")],
                 schema={"type": "object"}, complexity="short", max_tokens=i + 1, meta={"trace_row": i},
                 attributes={"task": "t", "n": i})
        c._line = i + 10
        out.append(c)
    return out


@pytest.fixture
def spooled() -> tuple[list[Case], SpooledCases]:
    cases = _cases(7)
    return cases, SpooledCases(iter(cases))


def test_spooled_cases_read_back_equal(spooled):
    cases, sp = spooled
    assert list(sp) == cases


def test_spooled_cases_keep_their_dataset_line(spooled):
    _, sp = spooled
    assert [c._line for c in sp] == list(range(10, 17))


def test_spooled_cases_count_like_a_list(spooled):
    cases, sp = spooled
    assert len(sp) == len(cases)


@pytest.mark.parametrize("i", [0, 3, 6, -1, -7])
def test_spooled_cases_index_like_a_list(spooled, i):
    cases, sp = spooled
    assert sp[i] == cases[i]


def test_a_spooled_index_past_the_end_is_an_index_error(spooled):
    _, sp = spooled
    with pytest.raises(IndexError):
        sp[7]


def test_a_spooled_slice_is_a_list_of_those_cases(spooled):
    cases, sp = spooled
    assert sp[1:4] == cases[1:4]


def test_passes_over_spooled_cases_may_nest(spooled):
    _, sp = spooled
    pairs = [(a.id, b.id) for a in sp for b in sp]
    assert len(pairs) == 49


def test_the_spool_file_goes_with_the_object():
    sp = SpooledCases(iter(_cases(2)))
    path = sp._path
    del sp
    gc.collect()
    assert not os.path.exists(path)


def test_no_cases_spool_to_an_empty_sequence():
    assert len(SpooledCases(iter(()))) == 0


def _trace(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"offset_s": i * 0.5, "messages": [{"role": "user", "content": f"q{i}"}],
                                     "max_tokens": 4}) + "\n" for i in range(n)), encoding="utf-8")
    return p


def _matrix() -> Matrix:
    return Matrix.model_validate({"name": "m", "baseline": "a", "variants": [
        {"name": "a", "endpoint": "http://127.0.0.1:9"}, {"name": "b", "endpoint": "http://127.0.0.1:9"}]})


def test_a_trace_s_cases_are_spooled_not_held(tmp_path):
    cases, _, _ = trace_cases(TraceSpec(str(_trace(tmp_path, 5)), "evalkit"), _matrix())
    assert isinstance(cases, SpooledCases)


def test_a_spooled_trace_keeps_every_row_in_order(tmp_path):
    cases, _, _ = trace_cases(TraceSpec(str(_trace(tmp_path, 5)), "evalkit"), _matrix())
    assert [c.meta["trace_row"] for c in cases] == [1, 2, 3, 4, 5]


def test_a_spooled_trace_s_offsets_are_sped_up(tmp_path):
    _, offsets, _ = trace_cases(TraceSpec(str(_trace(tmp_path, 3)), "evalkit", speedup=2.0), _matrix())
    assert offsets == [0.0, 0.25, 0.5]


def test_a_trace_limit_spools_only_its_rows(tmp_path):
    cases, offsets, _ = trace_cases(TraceSpec(str(_trace(tmp_path, 5)), "evalkit", limit=2), _matrix())
    assert (len(cases), len(offsets)) == (2, 2)
