// The Java consumer's reader in asyncconsumer's latency benchmark (benchmarks/latency.py compiles
// it with javac against the broker's own Kafka jars and runs it).
//
//   java -cp KAFKA_LIBS/*:CLASSES LatencyReader BOOTSTRAP TOPIC PARTITIONS COUNT OUT [KEY=VALUE...]
//
// A KafkaConsumer with the client's defaults (KEY=VALUE pairs override them, e.g.
// fetch.max.wait.ms=10), every partition assigned from the beginning (no consumer group), polling
// in a loop.  Each record's value starts with the producer's clock (big-endian int64 ns since the
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

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
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
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        for (int i = 5; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            props.put(pair[0], pair[1]);
        }
        long started = System.nanoTime();
        long[] latencies = new long[count];
        int measured = 0;
        long records = 0;
        long payload = 0;
        try (KafkaConsumer<byte[], byte[]> consumer =
                 new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> assigned = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                assigned.add(new TopicPartition(topic, p));
            }
            consumer.assign(assigned);
            consumer.seekToBeginning(assigned);
            long deadline = System.nanoTime() + 300_000_000_000L;
            while (measured < count) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException(measured + " of " + count + " measured records in 300 s");
                }
                ConsumerRecords<byte[], byte[]> polled = consumer.poll(Duration.ofMillis(100));
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
        }
        double wall = (System.nanoTime() - started) / 1e9;
        try (DataOutputStream stream = new DataOutputStream(new BufferedOutputStream(new FileOutputStream(out)))) {
            for (int i = 0; i < measured; i++) {
                stream.writeLong(latencies[i]);
            }
        }
        System.out.println("{\"client\": \"java-consumer\", \"records\": " + records + ", \"payload_bytes\": " + payload
            + ", \"wall_s\": " + wall + ", \"measured\": " + measured + ", \"error\": null}");
    }
}
