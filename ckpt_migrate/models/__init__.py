"""Model families: the one name table, tied weights, key vocabularies, detection, key steps."""
