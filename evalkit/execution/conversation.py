"""Conversations: a case with follow-up turns is sent turn by turn, each turn's history holding
the variant's *own* earlier replies, with the think time the turn asks for. Each turn is a row
of its own (`conversation_id`, `turn`, case id `CASE#tK`), graded like any case, formality
against the level that turn asks for. A turn that fails ends the conversation; the turns it left
are recorded (`not_sent`), and a resume continues from the ledger's stored replies."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Protocol

from ..ledger import Ledger
from .load import WorkItem
from .signals import STOP


class TurnSender(Protocol):
    """What a conversation needs of the sender (`sender.Sender`, which imports this module)."""

    ledger: Ledger
    run_id: str

    async def send_item(self, http: Any, item: WorkItem, attribute_now: bool, scheduled_ms: float | None = None,
                        messages: list[dict[str, str]] | None = None,
                        extra: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def not_sent(self, item: WorkItem, why: str, payload: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]: ...


async def send_conversation(sender: TurnSender, http: Any, item: WorkItem, attribute_now: bool,
                            scheduled_ms: float | None) -> list[dict[str, Any]]:
    """Every turn in order; returns the rows written (each turn's attempts, then any turns left)."""
    case = item.case
    done = sender.ledger.turn_texts(sender.run_id, item.variant, case.id, item.repeat, item.level)
    history = [m.model_dump() for m in case.messages]
    rows: list[dict[str, Any]] = []
    prev = ""
    for k in range(len(case.turns) + 1):
        if k:
            turn = case.turns[k - 1]
            history += [{"role": "assistant", "content": prev}, {"role": "user", "content": turn.content}]
        if k in done:  # sent before this resume: its reply is in the ledger
            prev = done[k]
            continue
        if k and case.turns[k - 1].think_time_s and not STOP.requested:
            await asyncio.sleep(case.turns[k - 1].think_time_s)
        sub = replace(item, case=case.turn_case(k))
        extra = {"conversation_id": case.id, "turn": k}
        got = await sender.send_item(http, sub, attribute_now, scheduled_ms if k == 0 else None, list(history), extra)
        rows += got
        if not got:  # stopping: the rest waits for a resume
            return rows
        last = got[-1]
        if last["error_class"] is not None or not last["final"]:
            why = f"turn {k} of the conversation failed ({last['error_class']}): the later turns need its reply"
            for j in range(k + 1, len(case.turns) + 1):
                rows.append(sender.not_sent(replace(item, case=case.turn_case(j)), why,
                                            extra={"conversation_id": case.id, "turn": j}))
            return rows
        prev = last["text"] or ""
    return rows
