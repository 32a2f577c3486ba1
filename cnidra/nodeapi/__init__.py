"""The node API (cnidra.node.v1alpha1): the node's pod networks from its own records."""
