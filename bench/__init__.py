"""Benchmarks: each script measures Genqueue next to a trivial baseline run side by side."""
