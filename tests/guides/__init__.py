"""Tests of what a user copies: getting-started, the examples, the docs' code blocks, the release."""
