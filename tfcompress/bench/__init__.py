"""Benchmarks (``tfcompress bench ...``): tables and plots, never timed unit tests."""

__all__: list[str] = []
