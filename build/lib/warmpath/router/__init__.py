"""The cache-aware router's pure policy code (no torch, no I/O): shared with the simulator."""
