"""Benchmarks: `python -m bench [section ...]` (`make bench`); see bench/__main__.py."""
