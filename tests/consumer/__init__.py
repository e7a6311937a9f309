"""Tests of the Consumer's API on real brokers: reading, offsets, deserializers, configuration, transactions."""
