"""The Hugging Face tensor tables, one module per CS key layout (as ``ckpt_migrate/catalogue/``
groups the families): declarations the interpreter of ``hf/table.py`` runs either way."""
