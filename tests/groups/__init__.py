"""Tests of consumer groups: assignors, both group protocols, members joining, leaving and killed."""
