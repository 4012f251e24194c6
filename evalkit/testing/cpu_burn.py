"""A fixed amount of CPU work, for a stub server whose tokens cost CPU like a real engine's: its
speed then depends on what else runs on its core (a neighbour that spins halves it), which a
test of the machine's load needs (tests/test_machine_load.py). One unit is about a microsecond of
one core on this project's machines; the work is the same however busy the core is."""

from __future__ import annotations


def burn(units: int) -> int:
    """Do ``units`` units of arithmetic (not sleep: a busy core makes it slower)."""
    x = 0
    for i in range(units * 12):
        x = (x * 31 + i) & 0xFFFF
    return x
