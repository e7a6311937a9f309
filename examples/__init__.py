"""Runnable examples (exercised by tests/guides/test_examples.py)."""
