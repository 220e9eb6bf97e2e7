"""The on-disk format: checkpoint bytes <-> the neutral tree. No torch, no TensorFlow,
nothing from the rooms above."""
