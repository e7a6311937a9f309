// The Java consumer's reader in asyncconsumer's latency benchmark (benchmarks/latency.py compiles
// it with javac against the broker's own Kafka jars and runs it).
//
//   java -cp KAFKA_LIBS/*:CLASSES LatencyReader BOOTSTRAP TOPIC PARTITIONS COUNT OUT [KEY=VALUE...]
//
// A KafkaConsumer with the client's defaults (KEY=VALUE pairs override them, e.g.
// fetch.max.wait.ms=10), every partition assigned from the beginning (no consumer group), polling
// in a loop.  With the pair share=GROUP it is a KafkaShareConsumer instead, subscribed to TOPIC in
// share group GROUP (which the driver set to read from the earliest offset), with implicit
// acknowledgement: what the share consumer's row is measured against.  Each record's value starts with the producer's clock (big-endian int64 ns since the
// epoch) and a flag byte (1: measured, 0: warm-up).  The wall clock is read once per poll() that
// returns records; for each measured record the hand-out time less its stamp goes to OUT as a
// big-endian int64 (ns) once COUNT measured records have come.  Prints READY after its first
// records, and a JSON line at the end.
import java.io.BufferedOutputStream;
import java.io.DataOutputStream;
import java.io.FileOutputStream;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.function.Supplier;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class LatencyReader {
    private static long nowNanos() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        int count = Integer.parseInt(args[3]);
        String out = args[4];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        String shareGroup = null;
        for (int i = 5; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            if (pair[0].equals("share")) {
                shareGroup = pair[1];
            } else {
                props.put(pair[0], pair[1]);
            }
        }
        long started = System.nanoTime();
        long[] latencies = new long[count];
        long[] tally = new long[3]; // measured, records, payload
        String client;
        if (shareGroup == null) {
            client = "java-consumer";
            props.put("enable.auto.commit", "false");
            props.put("auto.offset.reset", "earliest");
            try (KafkaConsumer<byte[], byte[]> consumer =
                     new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
                List<TopicPartition> assigned = new ArrayList<>();
                for (int p = 0; p < partitions; p++) {
                    assigned.add(new TopicPartition(topic, p));
                }
                consumer.assign(assigned);
                consumer.seekToBeginning(assigned);
                read(() -> consumer.poll(Duration.ofMillis(100)), latencies, tally);
            }
        } else {
            client = "java-share";
            props.put("group.id", shareGroup);
            try (KafkaShareConsumer<byte[], byte[]> consumer =
                     new KafkaShareConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
                consumer.subscribe(List.of(topic));
                read(() -> consumer.poll(Duration.ofMillis(100)), latencies, tally);
            }
        }
        double wall = (System.nanoTime() - started) / 1e9;
        try (DataOutputStream stream = new DataOutputStream(new BufferedOutputStream(new FileOutputStream(out)))) {
            for (int i = 0; i < tally[0]; i++) {
                stream.writeLong(latencies[i]);
            }
        }
        System.out.println("{\"client\": \"" + client + "\", \"records\": " + tally[1] + ", \"payload_bytes\": "
            + tally[2] + ", \"wall_s\": " + wall + ", \"measured\": " + tally[0] + ", \"error\": null}");
    }

    // Poll until latencies is full: tally gets the measured records, all records and their payload.
    private static void read(Supplier<ConsumerRecords<byte[], byte[]>> poll, long[] latencies, long[] tally) {
        int count = latencies.length;
        int measured = 0;
        long records = 0;
        long payload = 0;
        long deadline = System.nanoTime() + 300_000_000_000L;
        while (measured < count) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(measured + " of " + count + " measured records in 300 s");
            }
            ConsumerRecords<byte[], byte[]> polled = poll.get();
            if (polled.isEmpty()) {
                continue;
            }
            long now = nowNanos();
            for (ConsumerRecord<byte[], byte[]> record : polled) {
                byte[] key = record.key();
                byte[] value = record.value();
                records++;
                payload += (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
                if (value != null && value.length >= 9 && value[8] == 1 && measured < count) {
                    latencies[measured++] = now - ByteBuffer.wrap(value, 0, 8).getLong();
                }
            }
            if (records == polled.count()) {
                System.out.println("READY");
                System.out.flush();
            }
        }
        tally[0] = measured;
        tally[1] = records;
        tally[2] = payload;
    }
}
