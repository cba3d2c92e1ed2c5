"""Where span deltas go; the reference store is the simulator's (simulator/memory_store.py)."""
