"""Benchmarks of warmpath, grouped by the question each answers (``benchmarks/README.md``);
run a script as ``python -m benchmarks.<group>.<script>`` from the repository root."""
