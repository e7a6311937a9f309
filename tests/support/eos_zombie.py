"""A member that becomes a zombie mid-transaction (``tests/consumer/test_exactly_once.py``), in its own process.

``python eos_zombie.py CONFIG_JSON``: joins the group, takes one batch, begins a transaction of
confluent-kafka's producer and writes the batch's output (flushed: it is in the output log, the
transaction open), then writes ``holding`` (JSON: the records it holds and its group metadata) and
waits for the file ``go``.  Meanwhile the test freezes the process (SIGSTOP) past the session
timeout, lets another member take the partitions and process them, and thaws it.  Once ``go``
exists the zombie waits until its own loop has seen that it is no longer a member (its generation
changed: the coordinator refused a heartbeat), then does what a zombie's application does: sends
the batch's offsets to the transaction with ``group_metadata()`` and commits.  ``result`` (JSON)
says whether the broker refused it (and the transaction was aborted) or it went through.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
from confluent_kafka import KafkaException, Producer
from confluent_kafka import TopicPartition as OffsetToCommit

from asyncconsumer import Consumer


async def main(cfg: dict[str, Any]) -> None:
    producer = Producer({"bootstrap.servers": cfg["bootstrap"], "transactional.id": cfg["transactional_id"],
                         "transaction.timeout.ms": 60000, "log_level": 3})
    producer.init_transactions(30)
    options: dict[str, Any] = {"group_protocol": cfg["group_protocol"]}
    if cfg["group_protocol"] == "classic":
        options.update(session_timeout_ms=cfg["session_timeout_ms"], heartbeat_interval_ms=300)
    async with Consumer(bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"], isolation_level="read_committed",
                        enable_auto_commit=False, rebalance_safe_commits=False, auto_offset_reset="earliest",
                        fetch_max_wait_ms=100, retry_backoff_ms=50, **options) as consumer:
        consumer.subscribe([cfg["input"]])
        batch = {}
        while not batch:
            batch = await consumer.getmany(timeout=1.0, max_records=cfg["max_records"])
        producer.begin_transaction()
        for records in batch.values():
            for record in records:
                producer.produce(cfg["output"], value=b"processed:" + (record.value or b""), key=record.key)
        if producer.flush(30):
            raise RuntimeError("the transaction's records were not delivered")
        held = consumer.group_metadata()
        holding = {"records": sum(map(len, batch.values())), "generation": held.generation_id,
                   "member_id": held.member_id}
        await anyio.Path(cfg["holding"]).write_text(json.dumps(holding))

        go = anyio.Path(cfg["go"])
        while not await go.exists():  # noqa: ASYNC110 (the test's signal is a file)
            await anyio.sleep(0.05)
        # The loop runs meanwhile: its next heartbeat is refused and it gives up its generation.
        deadline = time.monotonic() + 30
        while consumer.metrics().rebalances.generation == held.generation_id:
            if time.monotonic() > deadline:
                raise RuntimeError("the member never noticed that it was fenced")
            await anyio.sleep(0.05)
        seen = consumer.metrics().rebalances
        metadata = consumer.group_metadata()
        offsets = [OffsetToCommit(tp.topic, tp.partition, records[-1].offset + 1) for tp, records in batch.items()]
        try:
            producer.send_offsets_to_transaction(offsets, metadata.for_confluent_kafka(), 30)
            producer.commit_transaction(30)
            outcome = "committed"
        except KafkaException as exc:
            error = exc.args[0]
            outcome = f"refused: {error.name()} (abortable: {error.txn_requires_abort()})"
            producer.abort_transaction(30)
        await anyio.Path(cfg["result"]).write_text(json.dumps({
            "outcome": outcome, "metadata": [metadata.generation_id, metadata.member_id],
            "member_state": seen.member_state, "generation_now": seen.generation,
        }))


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    anyio.run(main, config, backend=config.get("backend", "asyncio"))
