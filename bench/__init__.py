"""Benchmarks with their own runner (not timed tests), and the reference merge they time."""
