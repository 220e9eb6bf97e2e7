"""The run's ``params.yaml``: round-trip YAML edits and the hop-by-hop config upgrade."""
