"""The work against the shared store: span sync, fleet blocks, the store clock, sweeping."""
