"""Formats 0.1 - 0.4 (releases 1.7 - 2.4): the pickled ``__spec__`` and per-value tags."""
