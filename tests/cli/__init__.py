"""Tests of the command line: consume, lag, broker, produce, the verifiable tools beside Kafka's own."""
