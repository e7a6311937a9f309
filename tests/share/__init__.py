"""Tests of share groups (KIP-932): the ShareConsumer on Apache Kafka."""
