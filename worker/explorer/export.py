"""A GraphView as GraphML or Cytoscape.js JSON (pure: a view in, a document out).

Both are undirected graphs with one node per note (the note's id) and one edge per linked pair.
GraphML values are scalars, so lists and mappings (tags, keywords, metadata, merged_from, audit)
are JSON strings, the styles one space-separated string, times ISO 8601 strings, and a character
XML 1.0 forbids (most control characters) becomes U+FFFD. Cytoscape JSON keeps every value as it
is, with the node's ``value`` (its id) and ``name`` (its label) that ``networkx.cytoscape_graph``
expects, and edge ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from worker.explorer.view import GraphView

GRAPHML_NS = "http://graphml.graphdrawing.org/xmlns"
#: GraphML attribute types of the node fields; the other fields of a node are left out
NODE_TYPES = {
    "label": "string",
    "kind": "string",
    "styles": "string",
    "content": "string",
    "context": "string",
    "tags": "string",
    "keywords": "string",
    "metadata": "string",
    "agent": "string",
    "created_at": "string",
    "updated_at": "string",
    "event_time": "string",
    "valid_to": "string",
    "last_access": "string",
    "importance": "double",
    "access_count": "long",
    "version": "long",
    "degree": "long",
    "embedder": "string",
    "superseded_by": "string",
    "part_of": "string",
    "merged_from": "string",
    "audit": "string",
}
#: GraphML attribute types of the edge fields
EDGE_TYPES = {
    "weight": "double",
    "label": "string",
    "reason": "string",
    "provenance": "string",
    "at": "string",
    "style": "string",
}
#: characters XML 1.0 does not allow in a document
XML_ILLEGAL = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def to_graphml(view: GraphView) -> str:
    """``view`` as a GraphML document."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f'<graphml xmlns="{GRAPHML_NS}">']
    for kind, types in (("node", NODE_TYPES), ("edge", EDGE_TYPES)):
        out += [
            f'<key id="{kind[0]}_{name}" for="{kind}" attr.name="{name}" attr.type="{type_}"/>'
            for name, type_ in types.items()
        ]
    out.append(f'<graph id={_attr(view.namespace)} edgedefault="undirected">')
    for node in view.nodes:
        out.append(f"<node id={_attr(node['id'])}>")
        out += _data("n", NODE_TYPES, {**node, "styles": " ".join(node["styles"])})
        out.append("</node>")
    for edge in view.edges:
        ends = (_attr(edge[k]) for k in ("id", "source", "target"))
        out.append("<edge id={} source={} target={}>".format(*ends))
        out += _data("e", EDGE_TYPES, edge)
        out.append("</edge>")
    out += ["</graph>", "</graphml>", ""]
    return "\n".join(out)


def _data(prefix: str, types: Mapping[str, str], fields: Mapping[str, Any]) -> list[str]:
    return [
        f'<data key="{prefix}_{name}">{escape(_scalar(fields[name], type_))}</data>'
        for name, type_ in types.items()
        if fields.get(name) is not None
    ]


def _attr(text: str) -> str:
    return quoteattr(_xml_text(text))


def _scalar(value: Any, type_: str) -> str:
    if type_ == "double":
        return repr(float(value))
    if type_ == "long":
        return str(int(value))
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _xml_text(text)


def _xml_text(text: str) -> str:
    return XML_ILLEGAL.sub("\ufffd", text)


def to_cytoscape(view: GraphView) -> dict[str, Any]:
    """``view`` as Cytoscape.js JSON (``cy.json()`` elements, plus the graph's ``data``)."""
    nodes = [
        {"data": {**node, "value": node["id"], "name": node["label"]}, "classes": node["styles"]}
        for node in view.nodes
    ]
    edges = [{"data": dict(edge), "classes": [edge["style"]]} for edge in view.edges]
    return {
        "format_version": "1.0",
        "generated_by": "zettelq",
        "data": {"namespace": view.namespace, **view.selection},
        "directed": False,
        "multigraph": False,
        "elements": {"nodes": nodes, "edges": edges},
    }
