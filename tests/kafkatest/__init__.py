"""kafkatest's consumer and share-consumer scenarios, driven from here (docs/kafkatest.md).

A scenario of Apache Kafka's system tests (tests/kafkatest/tests/client/consumer_test.py and
share_consumer_test.py upstream) runs N verifiable-consumer processes of one client against a
local multi-node cluster, produces with Kafka's ``VerifiableProducer`` and checks kafkatest's
invariants at every event the members print.  Kafka's own Java tools calibrate the driver.
"""
