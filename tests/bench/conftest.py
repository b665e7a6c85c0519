"""Benchmarks are scripts, run by hand (see README.md); pytest never collects them as timed tests."""

collect_ignore_glob = ["bench_*.py"]
