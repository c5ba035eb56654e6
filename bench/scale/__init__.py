"""The parts of bench/million.py, the million-note namespace bench."""
