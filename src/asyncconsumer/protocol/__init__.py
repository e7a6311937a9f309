"""Kafka wire protocol: message codec (``api``), record batches and compression."""
