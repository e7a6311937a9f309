"""Side-by-side consumer benchmarks: ``python -m benchmarks.run [--quick] [--json F] [--markdown F]``.

Modules:
    run       the driver: embedded broker, data sets, interleaved rounds, report
    datasets  the data sets and their production with confluent-kafka
    clients   one reader per client/API, run in its own subprocess (``python -m benchmarks.clients``)
    memory    the slow-consumer memory benchmark (a subprocess too)
    decoder   compiled vs pure-Python record decoder, in process
    report    Markdown and JSON output

See docs/performance.md for what is measured and the last results.
"""
