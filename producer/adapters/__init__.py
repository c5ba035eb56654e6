"""Doors to zettelq from agent frameworks and other languages; each module needs its extra."""
