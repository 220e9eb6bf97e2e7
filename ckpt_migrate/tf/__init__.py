"""TensorFlow saver checkpoints <-> Cerebras H5.

The only room that imports TensorFlow; importing this package imports nothing."""
