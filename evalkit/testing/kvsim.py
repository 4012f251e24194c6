"""A token-exact model of vLLM's KV-cache scheduling, for the stub server: requests are admitted
only when their prompt fits in free blocks (else they wait), each generated token may need a new
block, and when none is free the newest running request is preempted (its blocks freed; it waits
and is recomputed later). Pressure then depends on tokens and overlap, never on how fast the stub
is, the property the capacity tests need."""

from __future__ import annotations

import asyncio
import math


class KvSim:
    def __init__(self, kv_tokens: int, block_size: int = 16, max_num_seqs: int = 256) -> None:
        self.block_size = block_size
        self.total_blocks = max(2, kv_tokens // block_size)
        self.usable = self.total_blocks - 1  # vLLM keeps one block back
        self.max_num_seqs = max_num_seqs
        self.held: dict[int, int] = {}  # request -> tokens it holds in the cache
        self.order: list[int] = []  # admission order: the newest is preempted first
        self.preempted: set[int] = set()
        self.waiting = 0
        self.preemptions = 0

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    @property
    def used_blocks(self) -> int:
        return sum(self._blocks(t) for t in self.held.values())

    @property
    def usage(self) -> float:
        return self.used_blocks / self.total_blocks

    @property
    def running(self) -> int:
        return len(self.held)

    async def admit(self, rid: int, tokens: int) -> None:
        """Wait until the request's tokens (its prompt, or prompt + output after a preemption) fit."""
        counted = False
        while len(self.held) >= self.max_num_seqs or self.used_blocks + self._blocks(tokens + 1) > self.usable:
            if not counted:
                self.waiting += 1
                counted = True
            await asyncio.sleep(0.002)
        if counted:
            self.waiting -= 1
        self.preempted.discard(rid)
        self.held[rid] = tokens
        self.order.append(rid)

    def grow(self, rid: int) -> bool:
        """One more token for a running request; False when that preempted the request itself."""
        if rid in self.preempted:
            return False
        need = self._blocks(self.held[rid] + 1) - self._blocks(self.held[rid])
        while need and self.used_blocks + need > self.usable:
            victim = self.order[-1]
            self.release(victim)
            self.preempted.add(victim)
            self.preemptions += 1
            if victim == rid:
                return False
        self.held[rid] += 1
        return True

    def release(self, rid: int) -> None:
        if rid in self.held:
            del self.held[rid]
            self.order.remove(rid)
