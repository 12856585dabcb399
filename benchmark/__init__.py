"""Benchmarks (pytest files named test_*_perf.py) and their harness,
performance_utils. A package so that tools/ can import the harness as
`benchmark.performance_utils`. Not part of the wheel."""
