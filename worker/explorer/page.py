"""The graph page: one self-contained HTML file (pure: a GraphView in, a str out).

Everything the page needs is inlined: the vendored Cytoscape.js and fCoSE (``assets/vendor``,
see its README), the page's own script and style, and the view as JSON in a
``<script type="application/json">`` element. Stored text is hostile input, so the JSON has
``<``, ``>`` and ``&`` (and U+2028/U+2029) as ``\\uXXXX`` escapes, which no HTML parser reads as
markup, and the page's script shows text only through ``textContent`` and canvas labels. The
page's Content-Security-Policy fetches nothing (``default-src 'none'``) and runs only the inline
scripts whose SHA-256 it lists, so even markup that got in could neither load nor run anything.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from importlib.resources import files
from typing import Any

from worker.explorer.view import GraphView

#: the vendored scripts, in load order (each after what it needs)
VENDOR_SCRIPTS = ("cytoscape.min.js", "layout-base.js", "cose-base.js", "cytoscape-fcose.js")
#: characters escaped in the embedded JSON: none of them can end the script element or start
#: markup, and the line separators stay valid in any JavaScript
JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


@functools.cache
def asset(name: str) -> str:
    """A file of ``assets/`` (``vendor/NAME`` for a vendored one) as text."""
    return (files("worker.explorer") / "assets" / name).read_text(encoding="utf-8")


def json_for_script(data: Any) -> str:
    """``data`` as JSON that is safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escaped in JSON_ESCAPES.items():
        text = text.replace(char, escaped)
    return text


def page_data(view: GraphView) -> dict[str, Any]:
    """What the page's script reads from ``#zq-data``."""
    return {
        "namespace": view.namespace,
        "selection": view.selection,
        "nodes": view.nodes,
        "edges": view.edges,
    }


def render_page(view: GraphView, extra: str | None = None) -> str:
    """The HTML page of ``view``; ``extra`` is HTML (already escaped) shown below the graph,
    whose forms may post to the page's own origin (the live explorer's review panel)."""
    scripts = [asset(f"vendor/{name}") for name in VENDOR_SCRIPTS] + [asset("explorer.js")]
    policy = [
        "default-src 'none'",
        "script-src " + " ".join(f"'sha256-{_digest(s)}'" for s in scripts),
        "style-src 'unsafe-inline'",
        "img-src data:",
        "form-action 'self'" if extra else "form-action 'none'",
    ]
    csp = "; ".join(policy)
    data = json_for_script(page_data(view))
    blocks = [f'<script type="application/json" id="zq-data">{data}</script>']
    blocks += [f"<script>{s}</script>" for s in scripts]
    html = asset("page.html").replace("zq:csp", csp, 1).replace("/*zq:css*/", asset("explorer.css"))
    html = html.replace("<!--zq:extra-->", extra or "", 1)
    return html.replace("<!--zq:scripts-->", "\n".join(blocks), 1)


def _digest(script: str) -> str:
    return base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
