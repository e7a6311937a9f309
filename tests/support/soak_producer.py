"""The soak's producer (``tests/resilience/test_soak.py``), in its own process: confluent-kafka, a steady rate.

``python soak_producer.py BOOTSTRAP TOPIC PARTITIONS RATE VALUE_SIZE OUT STOP``: produces ``RATE``
records a second (values of ``VALUE_SIZE`` bytes, round-robin over the partitions; acks=all,
idempotent, so a cut connection repeats nothing) until the file ``STOP`` appears, then flushes
and exits.  Each delivered record is appended to ``OUT`` as ``partition offset`` (line-buffered).
In a process of its own so that librdkafka's threads and sockets are not counted with the
consumer's.
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka import Producer


def main(bootstrap: str, topic: str, partitions: int, rate: int, value_size: int, out: str, stop: str) -> None:
    with open(out, "a", buffering=1) as delivered:

        def on_delivery(error: object, message: object) -> None:
            if error is None:
                delivered.write(f"{message.partition()} {message.offset()}\n")  # type: ignore[attr-defined]

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 20, "log_level": 3})
        tick, per_tick = 0.05, max(1, rate // 20)
        payload = os.urandom(value_size)
        sent, next_at = 0, time.monotonic()
        while not os.path.exists(stop):
            for _ in range(per_tick):
                producer.produce(topic, payload, b"%d" % sent, partition=sent % partitions, on_delivery=on_delivery)
                sent += 1
            producer.poll(0)
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
        if producer.flush(60) != 0:
            sys.exit("soak producer: records left undelivered after 60 s")


if __name__ == "__main__":
    bootstrap_, topic_, partitions_, rate_, size_, out_, stop_ = sys.argv[1:]
    main(bootstrap_, topic_, int(partitions_), int(rate_), int(size_), out_, stop_)
