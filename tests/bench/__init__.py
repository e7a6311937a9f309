"""Tests of the benchmarks run small: each reader reads everything and the reports are well formed."""
