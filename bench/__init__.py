"""Benchmarks. Run with `python -m bench.<name>`; they are not tests."""
