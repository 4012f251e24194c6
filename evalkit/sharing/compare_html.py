"""The comparison view's HTML (issue 35): the list of a run's pairs and one pair's page, as body
fragments the Datasette plugin puts inside Datasette's own page. Every value is escaped; no
script (a form posts a review)."""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import urlencode

from ..ledger.reviews import VERDICTS
from .compare import Filters

BASE = "/-/compare"
VERDICT_LABELS = {"same": "same", "candidate_better": "candidate better", "candidate_worse": "candidate worse",
                  "both_fail": "both fail"}
CSS = """
.ek-counts span{margin-right:1.2em}.ek-pairs td,.ek-pairs th{padding:2px 8px;vertical-align:top}
.ek-flip{color:#a40000;font-weight:bold}.ek-flip.ek-gain{color:#0a6b0a}.ek-side{display:flex;gap:1.5em;align-items:flex-start}
.ek-side>div{flex:1;min-width:0}.ek-text{white-space:pre-wrap;font-family:monospace;font-size:0.85em;
border:1px solid #ccc;padding:0.6em;background:#fafafa}.ek-text del{background:#ffd6d6;text-decoration:line-through}
.ek-text ins{background:#d4f7d4;text-decoration:none}.ek-tok{border-radius:2px}
.ek-tok.ek-first{outline:2px solid #000;outline-offset:0}.ek-first-mark{font-weight:bold;color:#000}
.ek-grades td,.ek-grades th{padding:2px 8px;vertical-align:top;border-bottom:1px solid #eee}
.ek-pass{color:#0a6b0a}.ek-fail{color:#a40000}.ek-review label,.ek-filters label{width:auto;display:inline-block;
margin:0 1.2em 0.4em 0;white-space:nowrap;font-weight:normal}.ek-filters select{max-width:14em}
.ek-legend{display:inline-block;width:8em;height:0.9em;vertical-align:middle;
background:linear-gradient(to right,rgba(220,40,20,0),rgba(220,40,20,0.85))}
"""


def _url(path: str, **q: Any) -> str:
    q = {k: v for k, v in q.items() if v not in (None, "", False)}
    return escape(path + ("?" + urlencode(q) if q else ""))


def case_url(run_id: str, case_id: str, candidate: str) -> str:
    return _url(f"{BASE}/case", run=run_id, case=case_id, candidate=candidate)


def _fmt(x: float | None, d: str = ".3g") -> str:
    return "-" if x is None else format(x, d)


def _flip_text(f: dict[str, Any]) -> str:
    what = f["grader"] + (f":{f['rule']}" if f["rule"] else "")
    return f"{what} {'lost' if f['baseline'] else 'gained'}"


def _flip_class(f: dict[str, Any]) -> str:
    return "ek-flip" if f["baseline"] else "ek-flip ek-gain"  # a lost pass in red, a gained one in green


def _select(name: str, options: list[str], chosen: str | None, blank: str = "any") -> str:
    opts = "".join(f"<option value='{escape(o)}'{' selected' if o == chosen else ''}>{escape(o)}</option>"
                   for o in options)
    return f"<select name='{escape(name)}'><option value=''>{escape(blank)}</option>{opts}</select>"


def list_page(data: dict[str, Any], db_name: str, review: bool) -> str:
    f: Filters = data["filters"]
    c = data["counts"]
    attrs = "".join(f"<label>{escape(k)} {_select('a.' + k, list(vals), f.attrs.get(k))}</label> "
                    for k, vals in data["facets"].items())
    form = (f"<form class='ek-filters' method='get' action='{BASE}'><input type='hidden' name='run' "
            f"value='{escape(data['run_id'])}'>"
            f"<label>variant {_select('candidate', data['candidates'], f.candidate)}</label> "
            f"<label>grader {_select('grader', data['graders'], f.grader)}</label> "
            f"<label>result {_select('result', ['pass', 'fail'], f.result)}</label> "
            f"<label><input type='checkbox' name='flips' value='1'{' checked' if f.flips_only else ''}> flips only"
            f"</label> {attrs}<input type='submit' value='filter'></form>")
    counts = (f"<p class='ek-counts'><span id='ek-shown'>{c['shown']} of {c['pairs']} pairs shown</span>"
              f"<span>{c['flips']} with a flip ({c['shown_flips']} shown)</span><span>{c['scored']} scored "
              f"teacher-forced</span><span>{c['reviewed']} reviewed</span></p>")
    rows = []
    for i, p in enumerate(data["pairs"], 1):
        flips = "<br>".join(f"<span class='{_flip_class(x)}'>{escape(_flip_text(x))}</span>" for x in p["flips"]) or "-"
        revs = ", ".join(f"{escape(r['reviewer'])}: {escape(VERDICT_LABELS[r['verdict']])}" for r in p["reviews"]) or "-"
        attrs_txt = ", ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in list(p["attributes"].items())[:4])
        rows.append(f"<tr class='ek-pair'><td>{i}</td><td><a href='{case_url(data['run_id'], p['case_id'], p['candidate'])}'>"
                    f"{escape(p['case_id'])}</a></td><td>{escape(p['candidate'])}</td><td>{flips}</td>"
                    f"<td>{_fmt(p['kl_mean'], '.4f')}</td><td>{_fmt(p['drift'], '.3f')}</td>"
                    f"<td>{'' if p['identical'] is None else ('yes' if p['identical'] else 'no')}</td>"
                    f"<td>{attrs_txt}</td><td>{revs}</td></tr>")
    mode = ("review mode: open a case to mark it" if review else "read-only (start `evalkit browse --review "
            "--reviewer NAME` to review)")
    return (f"<style>{CSS}</style><h1>Compare: run {escape(data['run_id'])}</h1>"
            f"<p>Each candidate's answer to a case against the baseline's (<b>{escape(data['baseline'])}</b>), "
            f"most interesting first: a pass/fail flip, then the largest teacher-forced KL, then drift. {mode}. "
            f"<a href='/{escape(db_name)}/reviews'>reviews table</a></p>{form}{counts}"
            "<table class='ek-pairs'><thead><tr><th>#</th><th>case</th><th>variant</th><th>flips</th>"
            "<th>KL/token</th><th>drift</th><th>identical</th><th>attributes</th><th>reviews</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _diff_side(diff: list[tuple[str, str, str]], side: int) -> str:
    out = []
    for op, a, b in diff:
        text = escape(a if side == 0 else b)
        if op == "equal" or not text:
            out.append(text)
        else:
            out.append(f"<del>{text}</del>" if side == 0 else f"<ins>{text}</ins>")
    return "".join(out)


def _first_text(kl: dict[str, Any]) -> str:
    """Which first divergence the page marks (`compare.heat`'s choice), in words."""
    if kl.get("first_diff_token") is not None:
        return f"the answers first differ at token {kl['first_diff_token']}"
    if kl.get("identical"):
        return "the answers are identical"
    if kl.get("first_top1_diff") is not None:
        return f"top-1 predictions first differ at token {kl['first_top1_diff']}"
    return "top-1 predictions agree at every token"


def heat_html(heat: list[dict[str, Any]]) -> str:
    if not heat:
        return "<p>No token-level scores for this pair (not scored teacher-forced, or another tokenizer).</p>"
    spans = []
    for t in heat:
        mark = "<span class='ek-first-mark' title='first divergence'>▶</span>" if t["first"] else ""
        style = f"background:rgba(220,40,20,{0.85 * t['shade']:.3f})" if t["shade"] > 0 else ""
        cls = "ek-tok ek-first" if t["first"] else "ek-tok"
        spans.append(f"{mark}<span class='{cls}' style='{style}' title='KL {t['kl']:.4g}' "
                     f"data-kl='{t['kl']:.6g}'>{escape(t['text'])}</span>")
    return f"<div class='ek-text ek-heat'>{''.join(spans)}</div>"


def _verdict(g: dict[str, Any] | None) -> str:
    if g is None:
        return "-"
    p = g.get("passed")
    tag = "" if p is None else ("<b class='ek-pass'>pass</b> " if p else "<b class='ek-fail'>fail</b> ")
    return f"{tag}{_fmt(g.get('value'))} <small>{escape(str(g.get('explanation') or ''))}</small>"


def review_form(v: dict[str, Any], reviewer: str, csrftoken: str | None) -> str:
    radios = "".join(f"<label><input type='radio' name='verdict' value='{k}' required> {escape(VERDICT_LABELS[k])}"
                     f"</label>" for k in VERDICTS)
    hidden = {"run": v["base"]["run_id"], "case": v["case_id"], "candidate": v["candidate"],
              "baseline_request_id": v["base"]["id"], "candidate_request_id": v["cand"]["id"]}
    if csrftoken:
        hidden["csrftoken"] = csrftoken
    fields = "".join(f"<input type='hidden' name='{k}' value='{escape(str(x))}'>" for k, x in hidden.items())
    return (f"<form class='ek-review' method='post' action='{BASE}/review'>{fields}<p>Reviewing as "
            f"<b>{escape(reviewer)}</b>: {radios}</p><p><textarea name='comment' rows='2' cols='80' "
            "placeholder='comment (optional)'></textarea></p><input type='submit' value='save review'></form>")


def case_page(v: dict[str, Any], db_name: str, review: str | None, csrftoken: str | None = None,
              saved: str | None = None) -> str:
    """One pair; ``review`` is the reviewer's name when reviews may be written."""
    b, c = v["base"], v["cand"]
    db = escape(db_name)

    def row_link(r: dict[str, Any]) -> str:
        return f"<a href='/{db}/requests/{r['id']}'>request {r['id']}</a>"

    lat = "".join(f"<tr><td>{escape(r['variant'])}</td><td>{_fmt(r.get('ttft_ms'), '.1f')}</td>"
                  f"<td>{_fmt(r.get('e2e_ms'), '.1f')}</td><td>{r.get('completion_tokens') or '-'}</td>"
                  f"<td>{escape(str(r.get('error_class') or ''))}</td><td>{row_link(r)} · <a href='/{db}/grades?"
                  f"request_id={r['id']}'>grades</a></td></tr>" for r in (b, c))
    scores = " · ".join(f"<a href='/{db}/token_scores/{i}'>token_scores {i}</a>" for i in v["token_rows"])
    kl = v["kl"]
    first = _first_text(kl)
    head = (f"KL {_fmt(kl.get('kl_mean'), '.4f')}/token (p99 {_fmt(kl.get('kl_p99'), '.3g')}), top-1 "
            f"{_fmt(kl.get('top1_pct'), '.1f')} %, {first}"
            if kl else "not scored teacher-forced")
    flips = "".join(f"<li class='{_flip_class(f)}'>{escape(_flip_text(f))}</li>" for f in v["flips"]) or "<li>no flip</li>"
    grades = "".join(f"<tr><td>{escape(g['grader'])}</td><td>{_verdict(g['baseline'])}</td>"
                     f"<td>{_verdict(g['candidate'])}</td></tr>" for g in v["verdicts"])
    past = "".join(f"<li>{escape(r['created_at'])} <b>{escape(r['reviewer'])}</b>: {escape(VERDICT_LABELS[r['verdict']])}"
                   f"{' — ' + escape(r['comment']) if r.get('comment') else ''}</li>" for r in v["all_reviews"])
    note = f"<p class='ek-saved'><b>saved review {escape(saved)}</b></p>" if saved else ""
    form = review_form(v, review, csrftoken) if review else "<p>read-only: start `evalkit browse --review --reviewer " \
        "NAME` to review this pair.</p>"
    back = _url(BASE, run=b["run_id"])
    return (f"<style>{CSS}</style><p><a href='{back}'>← all pairs of run {escape(b['run_id'])}</a></p>"
            f"<h1>Case {escape(v['case_id'])}: {escape(v['candidate'])} vs {escape(v['baseline'])}</h1>{note}"
            f"<ul>{flips}</ul><p>{head}. {scores}</p>"
            "<table class='ek-pairs'><tr><th>variant</th><th>TTFT ms</th><th>E2E ms</th><th>tokens</th><th>error</th>"
            f"<th>rows</th></tr>{lat}</table>"
            f"<div class='ek-side'><div><h2>baseline: {escape(b['variant'])}</h2><div class='ek-text ek-base'>"
            f"{_diff_side(v['diff'], 0)}</div></div><div><h2>candidate: {escape(c['variant'])}</h2>"
            f"<div class='ek-text ek-cand'>{_diff_side(v['diff'], 1)}</div></div></div>"
            "<h2>The baseline's answer, each token shaded by the candidate's KL there</h2><p>Teacher-forced: both "
            "servers scored the baseline's answer; darker is a larger KL, scaled to this answer's largest "
            f"(0 <span class='ek-legend'></span> {_fmt(kl.get('kl_max'), '.3g')} nats); ▶ marks the first divergence: where "
            "the answers first differ (temperature 0), or, for sampled answers, where the two servers' top-1 predictions "
            f"first differ; hover a token for its KL.</p>{heat_html(v['heat'])}"
            "<h2>Graders</h2><table class='ek-grades'><tr><th>grader</th><th>baseline</th><th>candidate</th></tr>"
            f"{grades}</table><h2>Reviews</h2><ul>{past or '<li>none yet</li>'}</ul>{form}")
