"""asyncconsumer: an asyncio-native Apache Kafka consumer (asyncio and trio via anyio)."""

from .structs import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

__all__ = ["ConsumerRecord", "OffsetAndMetadata", "OffsetAndTimestamp", "TopicPartition"]
__version__ = "0.1.0"
