"""The graph explorer: a namespace's notes and links as one self-contained HTML page, GraphML or
Cytoscape JSON (``zettelq graph``, in cli/graph.py), and served live by ``zettelq serve``
(``live``). ``view`` reads the selection from Redis; ``page`` and ``export`` turn it into files
without I/O."""

from worker.explorer.export import to_cytoscape, to_graphml
from worker.explorer.page import render_page
from worker.explorer.view import GraphView, read_view, select

__all__ = ["GraphView", "read_view", "render_page", "select", "to_cytoscape", "to_graphml"]
