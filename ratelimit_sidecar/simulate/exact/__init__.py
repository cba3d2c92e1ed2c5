"""Exact decision rules, written apart from the core: references for tests and the simulator."""
