"""Helpers for applications' own tests: an embedded Kafka-compatible broker."""

from .broker import EmbeddedBroker, EmbeddedBrokerError

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError"]
