"""Helpers the benchmark groups share (imported as ``benchmarks.common.<module>``)."""
