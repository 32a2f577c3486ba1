"""cnidra's durable node state: the prepared-claims checkpoint, the write-ahead sandbox records,
the CNI result cache and the plugins' data directories, all under one state root
(`StateLayout`), never in the node's shared `/var/lib/cni`."""
