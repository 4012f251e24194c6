"""Datasette plugin: the comparison pages (`/-/compare`: a run's pairs by interest; `/-/compare/case`:
one pair side by side with token heat) and, in review mode only, `/-/compare/review` that stores
a reviewer's verdict through the evalkit Ledger (never SQL here). `evalkit browse` passes the
ledger's path, the review mode and the reviewer in the plugin's config `evalkit-compare`."""

import asyncio
from typing import Any

from datasette import hookimpl
from datasette.utils.asgi import Response
from markupsafe import Markup

from evalkit.errors import EvalkitError
from evalkit.ledger import open_ledger
from evalkit.sharing.compare import Filters, case_list, case_view, submit_review
from evalkit.sharing.compare_html import BASE, case_page, list_page

PAGE = ('{% extends "base.html" %}{% block title %}{{ title }}{% endblock %}'
        '{% block content %}{{ body }}{% endblock %}')


def _config(datasette: Any) -> dict[str, Any]:
    cfg = dict(datasette.plugin_config("evalkit-compare") or {})
    if not cfg.get("ledger"):  # Datasette started by hand on a ledger: read-only, its first file
        db = next((d for d in datasette.databases.values() if getattr(d, "path", None)), None)
        cfg.update({"ledger": db.path if db else None, "db": db.name if db else "", "review": False})
    return cfg


async def _in_thread(fn: Any, *a: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *a)


def _with_ledger(path: str, fn: Any, *a: Any) -> Any:
    led = open_ledger(path, create=False)  # one connection per call: sqlite3 keeps a connection in its thread
    try:
        return fn(led, *a)
    finally:
        led.close()


async def _page(datasette: Any, request: Any, title: str, body: str, status: int = 200) -> Response:
    html = await datasette.render_template(datasette.jinja_env.from_string(PAGE),
                                           {"title": title, "body": Markup(body)}, request=request)
    return Response.html(html, status=status)


def _error(e: Exception) -> str:
    from html import escape

    return f"<h1>Compare</h1><p class='ek-error'>{escape(str(e))}</p>"


async def compare_list(request: Any, datasette: Any) -> Response:
    cfg = _config(datasette)
    q = {k: request.args.get(k) for k in request.args.keys()}
    try:
        data = await _in_thread(_with_ledger, cfg["ledger"], lambda led: case_list(led, q.get("run") or None,
                                                                                   Filters.from_query(q)))
    except EvalkitError as e:
        return await _page(datasette, request, "Compare", _error(e), 400)
    return await _page(datasette, request, f"Compare {data['run_id']}", list_page(data, cfg["db"], bool(cfg["review"])))


async def compare_case(request: Any, datasette: Any) -> Response:
    cfg = _config(datasette)
    a = request.args
    try:
        v = await _in_thread(_with_ledger, cfg["ledger"], lambda led: case_view(
            led, led.require_run(a.get("run") or None)["id"], a.get("case") or "", a.get("candidate") or ""))
    except EvalkitError as e:
        return await _page(datasette, request, "Compare", _error(e), 400)
    token = request.scope.get("csrftoken")
    body = case_page(v, cfg["db"], cfg.get("reviewer") if cfg.get("review") else None, token() if token else None,
                     a.get("saved"))
    return await _page(datasette, request, f"Case {v['case_id']}", body)


async def compare_review(request: Any, datasette: Any) -> Response:
    cfg = _config(datasette)
    if request.method != "POST":
        return Response.text("POST a review here", status=405)
    if not cfg.get("review"):
        return Response.text("read-only: start `evalkit browse --review --reviewer NAME` to review", status=403)
    form = await request.post_vars()

    try:
        rid = await _in_thread(_with_ledger, cfg["ledger"], lambda led: submit_review(led, form, cfg.get("reviewer")))
    except EvalkitError as e:
        return await _page(datasette, request, "Review", _error(e), 400)
    from urllib.parse import urlencode

    return Response.redirect(f"{BASE}/case?" + urlencode({"run": form.get("run"), "case": form.get("case"),
                                                          "candidate": form.get("candidate"), "saved": rid}))


@hookimpl
def register_routes() -> list[tuple[str, Any]]:
    return [(r"^/-/compare$", compare_list), (r"^/-/compare/case$", compare_case),
            (r"^/-/compare/review$", compare_review)]


@hookimpl
def menu_links(datasette: Any) -> list[dict[str, str]]:
    return [{"href": datasette.urls.path(BASE), "label": "Compare answers (baseline vs candidate)"}]
