"""Developer tools (not used at runtime)."""
