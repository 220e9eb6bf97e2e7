"""The torch-shaped API (``load``/``save``/``to_torch``/``from_torch``) and lazy tensors.

The only room that imports torch; importing this package imports nothing."""
