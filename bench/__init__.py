"""Benchmarks: run each as `python bench/NAME.py [--quick]`; never part of the test run."""
