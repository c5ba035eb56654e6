"""The graph explorer: a namespace's notes and links as one self-contained HTML page, GraphML
or Cytoscape JSON (``zettelq graph``). ``view`` reads the selection from Redis, ``page`` and
``export`` turn it into files without I/O, ``command`` is the CLI."""
