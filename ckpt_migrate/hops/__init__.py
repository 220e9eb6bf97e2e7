"""What a release hop is, the graph of all hops, and the tree operations many hops share."""
