"""Hugging Face export and import (issue #23): a Cerebras checkpoint of any release <-> a
Hugging Face model directory (``config.json`` + ``model.safetensors`` or shards), streaming one
tensor at a time.

``mapping`` is the contract between the pipeline and each family's rules (``families.py``, read
from the catalogue's records): a family's rules turn tensor *names and shapes* into a plan of
output tensors, each built from named inputs by a small numpy function, so the pipeline reads
only what one output needs.
"""
