"""The `arithmetic` suite: exact-answer word problems generated from seeded templates.

Sixteen templates (shopping, change, distances, durations, dates, counting, percentages, wages,
savings, stock, shared bills, speed and time), each in three tiers: tier 1 one or two steps with small
numbers, tier 2 a few steps, tier 3 more steps, larger numbers or decimals. Every item records
its template (its cluster), its tier, the parameters it was made from and its exact answer (a
canonical decimal string), computed with `Decimal` so no float rounding enters. The same seed
always gives the same items: each item's generator is seeded with `seed:template:tier:index`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from .items import Item, NumericItem, Suite
from .numbers import canonical

PER_CELL = 12  # items per (template, tier): 16 templates x 3 tiers x 12 = 576
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Farah", "Goran", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo", "Nora",
         "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tariq", "Uma", "Vera", "Wen", "Yusuf", "Zoe"]
GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("loaf of bread", "loaves of bread"),
         ("bottle of juice", "bottles of juice"), ("ticket", "tickets"), ("towel", "towels"), ("mug", "mugs"),
         ("plant pot", "plant pots"), ("light bulb", "light bulbs")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

Made = tuple[str, Decimal | int, dict[str, Any]]


def _money(rng: random.Random, lo: int, hi: int, cents: bool) -> Decimal:
    whole = rng.randint(lo, hi)
    return Decimal(whole) + (Decimal(rng.choice([25, 50, 75, 10, 45, 99])) / 100 if cents else 0)


def _dollars(d: Decimal) -> str:
    return f"${d:,.2f}" if d != d.to_integral_value() else f"${int(d):,}"


def _basket(rng: random.Random, tier: int) -> list[tuple[int, Decimal, int]]:
    """(count, unit price, good index) for 1-3 kinds of goods."""
    goods = rng.sample(range(len(GOODS)), tier)
    hi = (9, 25, 60)[tier - 1]
    return [(rng.randint(2, 4 + 3 * tier), _money(rng, 1, hi, tier == 3), g) for g in goods]


def _basket_text(basket: list[tuple[int, Decimal, int]]) -> str:
    parts = [f"{n} {GOODS[g][1]} at {_dollars(p)} each" for n, p, g in basket]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def shopping_total(rng: random.Random, tier: int) -> Made:
    name, basket = rng.choice(NAMES), _basket(rng, tier)
    total = sum(n * p for n, p, _ in basket)
    q = f"{name} buys {_basket_text(basket)}. How many dollars does {name} spend in total?"
    return q, total, {"items": [[n, str(p)] for n, p, _ in basket]}


def change_due(rng: random.Random, tier: int) -> Made:
    name, basket = rng.choice(NAMES), _basket(rng, tier)
    total = sum(n * p for n, p, _ in basket)
    paid = next((b for b in (20, 50, 100, 200, 500) if b >= total + 1), (int(total) // 100 + 1) * 100)
    q = (f"{name} buys {_basket_text(basket)} and hands over {_dollars(Decimal(paid))}. How many dollars of change "
         f"should {name} get back?")
    return q, paid - total, {"items": [[n, str(p)] for n, p, _ in basket], "paid": paid}


def distance_metres(rng: random.Random, tier: int) -> Made:
    name = rng.choice(NAMES)
    km = Decimal(rng.randint(2, 9)) + (Decimal(rng.choice([25, 5, 75])) / 100 if tier == 3 else 0)
    days = 1 if tier == 1 else rng.randint(2, 7 if tier == 2 else 14)
    extra = rng.choice([150, 300, 450, 800]) if tier == 3 else 0
    if tier == 1:
        q = f"{name} walks {km} kilometres to work. How many metres is that?"
    else:
        q = f"{name} cycles {km} kilometres every day for {days} days"
        q += f", and on the last day adds a detour of {extra} metres" if extra else ""
        q += ". How many metres does " + name + " cycle in total?"
    return q, km * days * 1000 + extra, {"km": str(km), "days": days, "extra_m": extra}


def duration_minutes(rng: random.Random, tier: int) -> Made:
    name = rng.choice(NAMES)
    hours, mins = rng.randint(1, 3), (0 if tier == 1 else rng.choice([10, 15, 20, 35, 45]))
    per_week = 1 if tier == 1 else rng.randint(2, 5)
    weeks = 1 if tier < 3 else rng.randint(3, 8)
    span = f"{hours} hour{'s' if hours > 1 else ''} and {mins} minutes"
    if tier == 1:
        q = f"A film lasts {hours} hour{'s' if hours > 1 else ''}. How many minutes is that?"
    elif tier == 2:
        q = f"{name} practises the piano {per_week} times a week, {span} each time. How many " \
            "minutes is that per week?"
    else:
        q = f"{name} trains {per_week} times a week for {weeks} weeks, {span} each session. " \
            "How many minutes does " + name + " train in all?"
    return q, (hours * 60 + mins) * per_week * weeks, {"hours": hours, "minutes": mins, "per_week": per_week,
                                                        "weeks": weeks}


def _date(rng: random.Random, years: tuple[int, int]) -> date:
    return date(rng.randint(*years), 1, 1) + timedelta(days=rng.randint(0, 364))


def _say(d: date) -> str:
    return f"{MONTHS[d.month - 1]} {d.day}, {d.year}"


def date_difference(rng: random.Random, tier: int) -> Made:
    start = _date(rng, (2019, 2026))
    span = rng.randint(3, 20) if tier == 1 else rng.randint(20, 70) if tier == 2 else rng.randint(150, 900)
    end = start + timedelta(days=span)
    q = f"How many days are there from {_say(start)} to {_say(end)}? (Count {_say(end)} but not {_say(start)}.)"
    return q, span, {"start": start.isoformat(), "end": end.isoformat()}


def date_after(rng: random.Random, tier: int) -> Made:
    start = _date(rng, (2019, 2026))
    n = rng.randint(2, 15) if tier == 1 else rng.randint(20, 60) if tier == 2 else rng.randint(100, 400)
    end = start + timedelta(days=n)
    q = f"A parcel is posted on {_say(start)} and arrives {n} days later. On which day of the month does it arrive? " \
        "(Give the day number only.)"
    return q, end.day, {"start": start.isoformat(), "days": n}


def weekday_count(rng: random.Random, tier: int) -> Made:
    start = _date(rng, (2020, 2026))
    span = rng.randint(6, 20) if tier == 1 else rng.randint(25, 70) if tier == 2 else rng.randint(100, 300)
    end = start + timedelta(days=span)
    wd = rng.randrange(7)
    n = sum(1 for k in range(span + 1) if (start + timedelta(days=k)).weekday() == wd)
    q = (f"{_say(start)} is a {WEEKDAYS[start.weekday()]}. How many {WEEKDAYS[wd]}s are there from {_say(start)} to "
         f"{_say(end)}, both days included?")
    return q, n, {"start": start.isoformat(), "end": end.isoformat(), "weekday": wd}


def multiples(rng: random.Random, tier: int) -> Made:
    lo = rng.randint(1, 30)
    hi = lo + (rng.randint(30, 90) if tier == 1 else rng.randint(100, 400) if tier == 2 else rng.randint(500, 2000))
    k = rng.randint(3, 9)
    m = rng.choice([x for x in range(2, 12) if x != k]) if tier == 3 else None
    count = sum(1 for x in range(lo, hi + 1) if x % k == 0 or (m is not None and x % m == 0))
    q = f"How many whole numbers from {lo} to {hi} (both included) are divisible by {k}"
    q += f" or by {m} (or both)?" if m else "?"
    return q, count, {"lo": lo, "hi": hi, "k": k, "m": m}


def round_robin(rng: random.Random, tier: int) -> Made:
    a = rng.randint(4, 12) if tier < 3 else rng.randint(5, 16)
    b = rng.randint(4, 12) if tier == 3 else 0
    twice = tier == 2
    if tier == 1:
        q = f"In a chess club of {a} players, every player plays every other player once. How many games are played?"
    elif tier == 2:
        q = f"In a league of {a} teams, every team plays every other team twice (home and away). How many matches " \
            "are played?"
    else:
        q = (f"A tournament has two groups of {a} and {b} players. Within each group everyone plays everyone else once, "
             "and then every player of the first group plays every player of the second group once. How many games "
             "are played in total?")
    games = a * (a - 1) // 2 * (2 if twice else 1) + b * (b - 1) // 2 + a * b
    return q, games, {"a": a, "b": b, "twice": twice}


def percent_price(rng: random.Random, tier: int) -> Made:
    price = _money(rng, 20, (80, 400, 900)[tier - 1], False)
    disc = rng.choice([10, 15, 20, 25, 30, 40])
    tax = rng.choice([5, 8, 10, 20]) if tier == 3 else 0
    qty = rng.randint(2, 5) if tier == 3 else 1
    good = rng.choice(["jacket", "lamp", "chair", "backpack", "kettle"])
    if tier == 1:
        q = f"What is {disc}% of {price}?"
        return q, price * disc / 100, {"price": str(price), "discount": disc, "tax": 0, "qty": 1, "form": "of"}
    after = price * (100 - disc) / 100
    if tier == 2:
        q = f"A {good} costs {_dollars(price)}. It is on sale at {disc}% off. What is the sale price in dollars?"
        return q, after, {"price": str(price), "discount": disc, "tax": 0, "qty": 1, "form": "sale"}
    q = (f"A {good} costs {_dollars(price)}. It is on sale at {disc}% off, and then a {tax}% sales tax is added to the "
         f"sale price. How many dollars do {qty} of them cost?")
    return q, after * (100 + tax) / 100 * qty, {"price": str(price), "discount": disc, "tax": tax, "qty": qty,
                                                  "form": "sale_tax"}


def percent_change(rng: random.Random, tier: int) -> Made:
    # only 2s and 5s in the old value: every percent change is a finite decimal
    old = rng.choice([20, 25, 40, 50, 80, 125, 200, 250, 400, 500, 800]) * (1 if tier == 1 else 10 if tier == 2 else 4)
    step = old // (rng.choice([4, 5, 10]) if tier == 1 else rng.choice([8, 20, 25, 40]))
    new = old + step * rng.randint(1, 6) * (-1 if tier == 3 and rng.random() < 0.5 else 1)
    what = rng.choice(["A town's population", "A shop's weekly sales", "The number of members of a club"])
    q = f"{what} changed from {old:,} to {new:,}. By what percent did it change? (Give a negative number for a decrease.)"
    return q, Decimal(new - old) * 100 / Decimal(old), {"old": old, "new": new}


def wages(rng: random.Random, tier: int) -> Made:
    name = rng.choice(NAMES)
    rate = _money(rng, 12, 30, tier == 3)
    hours = rng.randint(10, 38) if tier == 1 else rng.randint(42, 55)
    weeks = rng.randint(2, 4) if tier == 3 else 1
    pay = (rate * hours if hours <= 40 else rate * 40 + rate * Decimal("1.5") * (hours - 40)) * weeks
    q = f"{name} earns {_dollars(rate)} an hour and works {hours} hours a week"
    q += "" if tier == 1 else "; every hour over 40 in a week is paid at one and a half times the hourly rate"
    q += f". How many dollars does {name} earn in {weeks} weeks?" if weeks > 1 else f". How many dollars does {name} " \
                                                                                   "earn in one week?"
    return q, pay, {"rate": str(rate), "hours": hours, "weeks": weeks}


def savings(rng: random.Random, tier: int) -> Made:
    name = rng.choice(NAMES)
    start = rng.randint(0, 50) * 10 if tier > 1 else 0
    first, weeks = rng.randint(5, 25), rng.randint(4, 10 if tier < 3 else 20)
    inc = rng.randint(1, 5) if tier == 3 else 0
    total = start + sum(first + inc * k for k in range(weeks))
    q = f"{name} " + (f"has ${start} saved and " if start else "") + f"saves ${first} in the first week"
    q += f", then ${inc} more each week than the week before" if inc else " and the same amount every week after"
    q += f". How many dollars will {name} have after {weeks} weeks?"
    return q, total, {"start": start, "first": first, "weeks": weeks, "increase": inc}


def stock(rng: random.Random, tier: int) -> Made:
    start = level = rng.randint(50, 200) * (1 if tier < 3 else 10)
    events = []
    for _ in range(tier + 1):
        kind = rng.choice(["sells", "receives"]) if level > 20 else "receives"
        n = rng.randint(5, min(level - 1, 60 * tier) if kind == "sells" else 60 * tier)
        level += n if kind == "receives" else -n
        events.append((kind, n))
    shop = rng.choice(["A bakery", "A bookshop", "A hardware store", "A garden centre"])
    steps = ", then ".join(f"{k} {n}" for k, n in events)
    q = f"{shop} has {start:,} items in stock. On the following days it {steps} items. How many items are in stock now?"
    return q, level, {"start": start, "events": [[k, n] for k, n in events]}


def shared_bill(rng: random.Random, tier: int) -> Made:
    people = rng.randint(2, 8)
    tip = rng.choice([10, 15, 20]) if tier > 1 else 0
    if tier == 1:
        bill = Decimal(rng.randint(8, 40) * people)
    elif tier == 2:
        bill = Decimal(people * 4 * rng.randint(3, 30))  # every share is a whole number of dimes
    else:
        while True:  # a bill whose share is no exact half cent: "nearest" has one answer
            bill = _money(rng, 40, 400, True)
            exact = bill * (100 + tip) / 100 / people
            if (exact * 1000) % 10 != 5:
                break
    total = bill * (100 + tip) / 100
    q = f"{people} friends eat out and the bill is {_dollars(bill)}"
    q += f". They add a {tip}% tip to the bill and" if tip else ". They"
    q += " split the total equally. How many dollars does each friend pay?"
    if tier == 3:
        q += " (Round to the nearest cent.)"
        share = (total / people).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    else:
        share = total / people
    return q, share, {"bill": str(bill), "tip": tip, "people": people, "rounded": tier == 3}


def speed_time(rng: random.Random, tier: int) -> Made:
    speed = rng.choice([30, 40, 45, 50, 60, 72, 80, 90]) * (1 if tier < 3 else 2)
    legs = 1 if tier < 3 else rng.randint(2, 3)
    while True:  # km/h x minutes / 60 is a finite decimal only when 3 divides km/h x minutes
        minutes = rng.choice([30, 60, 90, 120]) if tier == 1 else rng.choice([20, 40, 50, 75, 105])
        if speed * minutes * legs % 3 == 0:
            break
    vehicle = rng.choice(["A bus", "A train", "A car", "A ferry"])
    dist = Decimal(speed) * minutes * legs / 60
    q = f"{vehicle} travels at a steady {speed} km per hour for {minutes} minutes"
    q += f", and makes the same trip {legs} times in a day" if legs > 1 else ""
    q += ". How many kilometres does it travel" + (" in the day?" if legs > 1 else "?")
    return q, dist, {"speed": speed, "minutes": minutes, "legs": legs}


TEMPLATES: dict[str, Callable[[random.Random, int], Made]] = {f.__name__: f for f in (
    shopping_total, change_due, distance_metres, duration_minutes, date_difference, date_after, weekday_count,
    multiples, round_robin, percent_price, percent_change, wages, savings, stock, shared_bill, speed_time)}
TIERS = (1, 2, 3)


def generate(seed: int = 0, per_cell: int = PER_CELL) -> list[Item]:
    """Every template x tier x index item, seeded (string seeds: stable across Python runs)."""
    out: list[Item] = []
    for name, make in TEMPLATES.items():
        for tier in TIERS:
            for i in range(per_cell):
                q, answer, params = make(random.Random(f"{seed}:{name}:{tier}:{i}"), tier)
                out.append(NumericItem(f"{name}-t{tier}-{i:02d}", q, canonical(Decimal(answer)), name, name, tier,
                                       params))
    return out


def shipped_arithmetic(seed: int = 0) -> Suite:
    return Suite("arithmetic", generate(seed))
