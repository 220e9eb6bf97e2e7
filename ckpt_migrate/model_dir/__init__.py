"""A model directory: checkpoint names, CheckpointManager, upgrade-dir."""
