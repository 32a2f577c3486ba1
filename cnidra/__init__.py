"""cnidra: a Kubernetes network DRA driver attaching secondary pod interfaces with CNI."""

__version__ = "0.1.0"
