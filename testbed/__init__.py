"""The test bed: a real single-node Kubernetes on this machine (`cluster`), built from the Go
module proxy, and the driver run against it as a process (`driver`). Shared by the tests and
the benchmarks; not part of the cnidra package. See docs/testbed.md."""
