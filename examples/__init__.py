"""Runnable examples (exercised by tests/test_examples.py)."""
