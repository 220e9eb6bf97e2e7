"""Format 0.5 (releases 2.5 - 2.10): per-leaf metadata and the JSON treespec."""
