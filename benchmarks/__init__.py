"""Side-by-side consumer benchmarks: ``python -m benchmarks.run [--quick] [--json F] [--markdown F]``.

Modules:
    run       the driver: broker, data sets, interleaved rounds, report
    brokers   Apache Kafka (default where Java 17+ is present) or the embedded Tansu
    datasets  the data sets and their production with confluent-kafka
    clients   one reader per client/API, run in its own subprocess (``python -m benchmarks.clients``)
    java      the Java consumer row: Kafka's ConsumerPerformance in a JVM of its own (Apache Kafka only)
    memory    the slow-consumer memory benchmark (a subprocess too)
    decoder   compiled vs pure-Python record decoder, in process
    report    Markdown and JSON output
    steady    on its own (``python -m benchmarks.steady``): the JIT-warm Java consumer on a larger topic

See docs/performance.md for what is measured and the last results.
"""
