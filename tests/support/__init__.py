"""Test infrastructure: brokers, producer helpers, a fault-injecting TCP proxy, TLS certificates.

Modules:

- :mod:`support.broker`   -- start/stop a Tansu broker process, or Apache Kafka (asyncconsumer.testing.KafkaBroker).
- :mod:`support.producer` -- ``create_topic`` / ``produce`` helpers built on confluent-kafka.
- :mod:`support.proxy`    -- :class:`~support.proxy.ChaosProxy`, an anyio TCP (and TLS-terminating) proxy.
- :mod:`support.certs`    -- a throw-away CA plus server and client certificates.
"""
