"""Tests of asyncconsumer.testing: the brokers, the registry, the pytest plugin, the kafkatest driver."""
