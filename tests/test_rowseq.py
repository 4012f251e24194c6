"""`rowseq.Rows` made from tables (a view made as each row is read) reads, and changes, as the
plain list of those views: every list operation a reader or plugin may use gives what it gives on
the list (issue 37: a view held per row was 20 MB a slice at 2 M rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from evalkit.reporting.rows import Column, Table, row_index, table_of
from evalkit.reporting.rowseq import Row, Rows, succeeded, take, where


def _table(variant: str, xs: list[Any], errors: list[Any]) -> Table:
    t = Table()
    for name, vals in (("variant", [variant] * len(xs)), ("x", xs), ("error_class", errors)):
        c = Column()
        c.extend(vals)
        c.compact()
        t.columns[name] = c
    t.n = len(xs)
    t.finish({})
    return t


A = dict(variant="a", xs=[3, 1, 4, 1, 5, 9], errors=[None, "timeout", None, None, "http", None])
B = dict(variant="b", xs=[2, 7, 1], errors=[None, None, "timeout"])


def lazy() -> Rows:
    """Rows of two tables: all of one, some of the other (as a slice beside the baseline's)."""
    return Rows.of([(_table(**A), None), (_table(**B), np.array([2, 0]))])


def plain() -> list[dict[str, Any]]:
    """The same rows as dicts, in order."""
    a = [{"variant": "a", "x": x, "error_class": e} for x, e in zip(A["xs"], A["errors"], strict=True)]
    b = [{"variant": "b", "x": B["xs"][i], "error_class": B["errors"][i]} for i in (2, 0)]
    return a + b


def as_dicts(rows: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in rows]


def test_lazy_rows_hold_no_view_a_row():
    assert list.__len__(lazy()) == 0


def test_lazy_rows_iterate_as_the_list():
    assert as_dicts(lazy()) == plain()


def test_lazy_rows_have_its_length():
    assert len(lazy()) == len(plain())


@pytest.mark.parametrize("k", [0, 5, 6, 7, -1, -8])
def test_lazy_rows_index_as_the_list(k):
    assert dict(lazy()[k]) == plain()[k]


@pytest.mark.parametrize("k", [8, -9])
def test_lazy_rows_raise_index_error_past_the_end(k):
    with pytest.raises(IndexError):
        lazy()[k]


@pytest.mark.parametrize("s", [slice(1, 7), slice(None, None, -2), slice(5, 2, -1), slice(20, 30)])
def test_lazy_rows_slice_as_the_list(s):
    assert as_dicts(lazy()[s]) == plain()[s]


def test_lazy_rows_reverse_as_the_list():
    assert as_dicts(reversed(lazy())) == plain()[::-1]


def test_lazy_rows_contain_a_row_they_list():
    assert plain()[6] in lazy()


def test_lazy_rows_do_not_contain_a_row_they_do_not_list():
    assert {"variant": "b", "x": 7, "error_class": None} not in lazy()


def test_lazy_rows_equal_the_list():
    assert lazy() == plain()


def test_lazy_rows_are_empty_only_when_they_list_nothing():
    assert (bool(lazy()), bool(Rows.of([]))) == (True, False)


@pytest.mark.parametrize(("op", "args"), [
    ("append", ({"x": 0},)), ("extend", ([{"x": 0}],)), ("insert", (2, {"x": 0})), ("pop", ()), ("pop", (1,)),
    ("clear", ()), ("reverse", ()), ("sort", ()), ("__setitem__", (1, {"x": 0})), ("__delitem__", (slice(1, 3),)),
    ("__iadd__", ([{"x": 0}],)), ("__imul__", (2,)),
])
def test_a_change_to_lazy_rows_is_the_change_to_the_list(op, args):
    rows, want = lazy(), plain()
    kw = {"key": lambda r: r["x"]} if op == "sort" else {}
    getattr(rows, op)(*args, **kw)
    getattr(want, op)(*args, **kw)
    assert as_dicts(rows) == want


def test_a_list_added_to_lazy_rows_is_the_lists_added():
    assert as_dicts([{"x": 0}] + lazy()) == [{"x": 0}, *plain()]


def test_lazy_rows_added_to_a_list_are_the_lists_added():
    assert as_dicts(lazy() + [{"x": 0}]) == [*plain(), {"x": 0}]


def test_lazy_rows_unpack_as_the_list():
    assert as_dicts([*lazy()]) == plain()


def test_lazy_rows_find_a_row_s_place_as_the_list():
    assert lazy().index(plain()[7]) == 7


def test_rows_kept_by_a_flag_each_are_those_of_the_list():
    keep = [i % 3 != 1 for i in range(8)]
    assert as_dicts(where(lazy(), keep)) == [r for r, k in zip(plain(), keep, strict=True) if k]


def test_rows_kept_by_a_flag_each_are_still_made_when_read():
    assert where(lazy(), [True] * 8).parts is not None


@pytest.mark.parametrize("positions", [[0, 2, 7], [6, 7], [], [3]])
def test_rows_taken_at_places_are_those_of_the_list(positions):
    assert as_dicts(take(lazy(), positions)) == [plain()[i] for i in positions]


def test_rows_taken_out_of_order_across_tables_are_those_of_the_list():
    assert as_dicts(take(lazy(), [7, 0, 6])) == [plain()[i] for i in (7, 0, 6)]


def test_a_plain_list_kept_or_taken_stays_a_plain_list():
    assert (where(plain(), [True] * 8), take(plain(), [1])) == (plain(), [plain()[1]])


def test_succeeded_rows_are_the_rows_without_an_error_class():
    assert as_dicts(succeeded(lazy())) == [r for r in plain() if r["error_class"] is None]


def test_succeeded_rows_are_still_made_when_read():
    assert succeeded(lazy()).parts is not None


def test_rows_grouped_by_a_column_are_the_list_s_groups_in_order():
    want: dict[str, list[dict[str, Any]]] = {}
    for r in plain():
        want.setdefault(r["variant"], []).append(r)
    assert {k: as_dicts(v) for k, v in lazy().groups("variant").items()} == want


def test_rows_grouped_by_a_column_keep_the_order_values_are_first_met():
    assert list(lazy().groups("variant")) == ["a", "b"]


def test_rows_of_two_tables_chained_are_both_lists_in_order():
    a, b = Rows.of([(_table(**A), None)]), Rows.of([(_table(**B), None)])
    assert as_dicts(Rows.chain(a, b)) == as_dicts(a) + as_dicts(b)


def test_rows_chained_with_a_plain_list_are_a_plain_list():
    assert Rows.chain(lazy(), [{"x": 0}]).parts is None


def test_rows_of_one_table_have_that_table():
    t = _table(**A)
    assert table_of(Rows.of([(t, np.array([1, 3]))])) is t


def test_rows_of_two_tables_have_no_one_table():
    assert table_of(lazy()) is None


def test_rows_of_one_table_know_each_row_s_place():
    t = _table(**A)
    _, idx = row_index(Rows.of([(t, np.array([4, 1]))]))  # type: ignore[misc]
    assert idx.tolist() == [4, 1]


def test_a_row_made_when_read_is_a_row_of_its_table():
    r = lazy()[7]
    assert (type(r), r._i) == (Row, 0)
