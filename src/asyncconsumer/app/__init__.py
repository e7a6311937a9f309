"""The application side of the consumer, below the ``Consumer`` facade and above the engine.

- ``collector.py``: records from the fetch buffer to the application (polls,
  chunks for ``async for``/``batches()``, rewinds, deserializers);
- ``rebalance.py``: rebalance callbacks, their acknowledgements and the
  rebalance-safe commit;
- ``streams.py``: per-partition streams (``consumer.partitions()``).

Each talks to the engine (``engine.loop.Engine``) or to a small protocol
(``streams.StreamSource``), never to ``Consumer``'s private members.
"""
