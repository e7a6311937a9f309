"""Tests of brokers killed, partitioned and slowed under a consumer; the long soak."""
