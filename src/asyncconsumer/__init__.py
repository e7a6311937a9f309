"""asyncconsumer: an asyncio-native Apache Kafka consumer (asyncio and trio via anyio).

    async with Consumer(bootstrap_servers="127.0.0.1:9092", group_id="g1") as consumer:
        consumer.assign([TopicPartition("events", 0)])
        async for record in consumer:
            ...
"""

from . import errors
from ._version import __version__
from .app.streams import PartitionStream
from .config import ConsumerConfig
from .consumer import Consumer
from .errors import (
    AcknowledgementRequiredError,
    AcquisitionLockExpiredError,
    CommitFailedError,
    ConcurrentAccessError,
    ConfigError,
    ConsumerClosedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailableError,
    NoOffsetForPartitionError,
    PollIntervalExceededError,
    RebalanceCallbackError,
    RecordDeserializationError,
)
from .listener import RebalanceListener
from .metrics import ConsumerMetrics, PartitionMetrics, ShareConsumerMetrics
from .share import AcknowledgementResult, ShareConsumer
from .structs import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    AcknowledgeType,
    ConsumerGroupMetadata,
    ConsumerRecord,
    DeserializationContext,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    RecordDeserializer,
    ShareConsumerRecord,
    TopicPartition,
)

__all__ = [
    "AcknowledgeType",
    "AcknowledgementResult",
    "ShareConsumer",
    "ShareConsumerRecord",
    "ShareConsumerMetrics",
    "AcknowledgementRequiredError",
    "AcquisitionLockExpiredError",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "CommitFailedError",
    "ConcurrentAccessError",
    "ConfigError",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerGroupMetadata",
    "ConsumerMetrics",
    "ConsumerRecord",
    "DeserializationContext",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaTimeoutError",
    "NoBrokersAvailableError",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionMetrics",
    "PartitionStream",
    "PollIntervalExceededError",
    "RebalanceCallbackError",
    "RebalanceListener",
    "RecordDeserializationError",
    "RecordDeserializer",
    "TopicPartition",
    "__version__",
    "errors",
]
