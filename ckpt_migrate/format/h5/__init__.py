"""HDF5 helpers: bounded reads, string attributes, the root-group switch, tensor datasets."""
