"""The application side of the clients, below the ``Consumer`` and ``ShareConsumer`` facades and
above the engine.

- ``client.py``: what both facades share: the ``async with`` lifecycle around their loop and
  the KIP-957 ``acquire()``/``release()`` hooks (``bracketed`` wraps a public method);
- ``collector.py``: records from the fetch buffer to the application (polls, the fetch walk,
  chunks for ``async for``/``batches()``, rewinds, deserializers);
- ``arrow.py``: ``arrow_batches()``, a partition's records as Arrow columns;
- ``share_collector.py``: the share consumer's collector: acquired records to the application
  and the ledger of what is handed out and not acknowledged;
- ``rebalance.py``: rebalance callbacks, their acknowledgements and the rebalance-safe commit;
- ``streams.py``: per-partition streams (``consumer.partitions()``);
- ``iterators.py``: ``Steps``, the async iterator the stepwise reads return;
- ``metrics.py``: ``metrics()`` snapshots assembled from the counters.

Each talks to the engine (``engine.loop.Engine``, ``engine.share_loop.ShareEngine``) or to a
small protocol (``streams.StreamSource``), never to a facade's private members.
"""
