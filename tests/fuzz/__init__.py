"""Differential fuzzer for gemsops against torch: `python -m tests.fuzz
--help`. Case i of seed S is a function of (S, i, --ops, --device) alone;
--replay i re-runs it in-process and prints what it called."""
