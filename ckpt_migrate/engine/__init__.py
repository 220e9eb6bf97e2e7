"""Upgrading one checkpoint: plan -> hops -> copy-patch or rewrite -> verify -> publish."""
