"""Exact references of the decision rules, for tests and the simulator to measure against.

Each one decides from the full log of admitted hits, by the rule's definition and nothing else:
small and slow on purpose, sharing no code with the core modules they check.
"""
