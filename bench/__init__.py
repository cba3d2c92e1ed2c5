"""Benchmarks: `python -m bench [section ...]` (`make bench`). See bench/__main__.py."""
