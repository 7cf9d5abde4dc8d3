"""Benchmarks: each one a command that writes a JSON under benchmarks/results/."""
