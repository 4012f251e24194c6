"""Exact numbers as text: one canonical decimal string per value, so `1,000.0`, `$1000` and `1000`
compare equal and an expected answer is stored the way an extracted one is normalised."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# a number as people write it: an optional sign, an optional currency sign, digits with or without
# thousands separators, an optional decimal part; the match never ends on a full stop
NUMBER = re.compile(r"(?<![\w.])([-−–]?)\s?[$€£]?\s?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?!\d)")


def canonical(value: Decimal | int | str) -> str:
    """`1000`, `12.5`, `-3`: no exponent, no trailing zeros, no `-0`."""
    d = value if isinstance(value, Decimal) else Decimal(str(value))
    if d == 0:
        return "0"
    s = format(d.normalize(), "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def parse_number(text: str) -> str | None:
    """The one number ``text`` is (after `$`, thousands commas, units or a full stop around it), as
    a canonical string; None when it holds no number or more than one."""
    found = NUMBER.findall(text)
    if len(found) != 1:
        return None
    return _to_canonical(found[0])


def _to_canonical(match: tuple[str, str]) -> str | None:
    sign, digits = match
    try:
        d = Decimal(digits.replace(",", ""))
    except InvalidOperation:
        return None
    return canonical(-d if sign else d)


def numbers_in(text: str) -> list[str]:
    """Every number in the text, in order, canonical."""
    return [c for m in NUMBER.findall(text) if (c := _to_canonical(m)) is not None]


def same_number(a: str | None, b: str | None) -> bool:
    """Exact equality of two numbers after normalisation (`1,000.0` == `1000`); False when either
    is not a number."""
    if a is None or b is None:
        return False
    try:
        return Decimal(a.replace(",", "")) == Decimal(b.replace(",", ""))
    except InvalidOperation:
        return False
