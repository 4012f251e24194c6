"""One server at a time, alternated in balanced blocks (`--order blocks`, issue 47): where the
variants cannot all be up at once (a GPU that holds one model), each chunk of at least
`order.MIN_BLOCK` cases goes to every variant in turn, in A B, then B A order, so a change of the
machine lands on both sides alike instead of on whichever variant ran second.

A switch is vLLM's sleep mode where the launched server has it (`--enable-sleep-mode`: `/sleep`
level 1 frees the accelerator's memory, `/wake_up` brings the weights back), else a stop and a
fresh start; an endpoint needs none. Each switch and its time go to the ledger (`switches`)."""

from __future__ import annotations

from dataclasses import replace

from ..ledger import utcnow
from .order import MIN_BLOCK, balanced, chunks
from .runner import RunContext, run_group


def sleep_mode_here() -> bool:
    """Whether launched servers get vLLM's sleep mode: on a GPU (it frees device memory; vLLM's CPU
    build has none) with a vLLM that knows the option."""
    from ..engines.vllm_server import vllm_has_option
    from ..host import this_host

    return bool(this_host().get("gpu_json")) and vllm_has_option("--enable-sleep-mode")


def run_blocks(ctx: RunContext, names: list[str], seq: int) -> int:
    """Send the run block by block: chunk k of the cases to each variant in turn (balanced orders),
    each block with its server brought up (or woken) for it and stopped (or put to sleep) after."""
    order = ctx.load.policy.order
    size = max(order.chunk, MIN_BLOCK)  # one server at a time: at least six cases a variant between switches
    ctx.sleep_mode = sleep_mode_here()
    perms = balanced(names, order.seed)
    parts = list(chunks(list(ctx.cases), size))
    for b, part in enumerate(parts):
        for pos, name in enumerate(next(perms)):
            block = replace(ctx, cases=part, stamp=(b, pos), keep_asleep=b < len(parts) - 1, switched={}, switch_s={})
            seq = run_group(block, [name], seq, variants_after=0)
            if name in block.switched:
                ctx.ledger.record_switch({"run_id": ctx.run_id, "variant": name, "block": b, "position": pos,
                                          "kind": block.switched[name], "took_s": round(block.switch_s.get(name, 0.0), 3),
                                          "ts": utcnow()})
            if ctx.load.policy.stop_on_failure and ctx.summary.failed_variants:
                ctx.stop_reason = f"stopped after a failed variant ({', '.join(ctx.summary.failed_variants)})"
                ctx.progress.say(ctx.stop_reason)
                return seq
    for live in ctx.asleep.values():  # the last block's servers, kept asleep for nothing more
        for s in live.values():
            s.close("complete")
    ctx.asleep.clear()
    return seq
