"""cnidra's cluster-wide IPAM: addresses from the node's blocks of admin-defined pools, given at
prepare, and the reconciler that frees what nobody holds (docs/ipam.md)."""
