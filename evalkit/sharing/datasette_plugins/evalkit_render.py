"""Datasette plugin: render generated text readably (JSON outputs as labelled fields), escaped."""

import json
from html import escape

from datasette import hookimpl
from markupsafe import Markup


@hookimpl
def render_cell(value, column, table):
    if column != "text" or not isinstance(value, str) or not value:
        return None
    try:
        obj = json.loads(value)
    except ValueError:
        return Markup(f'<div style="white-space:pre-wrap;max-width:48em">{escape(value)}</div>')
    if not isinstance(obj, dict):
        return None
    rows = "".join(f"<dt><b>{escape(str(k))}</b></dt><dd style='white-space:pre-wrap'>"
                   f"{escape(v if isinstance(v, str) else json.dumps(v))}</dd>" for k, v in obj.items())
    return Markup(f"<dl style='max-width:48em'>{rows}</dl>")
