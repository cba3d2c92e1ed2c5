"""Where span deltas go: the store protocol, its failures and its Redis backend (the in-memory
reference store is the simulator's: simulator/memory_store.py)."""
