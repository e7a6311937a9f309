import java.io.FileWriter;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.telemetry.ClientTelemetryContext;
import org.apache.kafka.server.telemetry.ClientTelemetryExporter;
import org.apache.kafka.server.telemetry.ClientTelemetryExporterProvider;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.Metric;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.MetricsData;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.ResourceMetrics;
import org.apache.kafka.shaded.io.opentelemetry.proto.metrics.v1.ScopeMetrics;

/** A broker plugin for tests/test_metrics_push.py, named in the broker's metric.reporters: it
 * receives the metrics clients push (KIP-714; Apache Kafka 4.4's ClientTelemetryExporterProvider,
 * which replaces the deprecated ClientTelemetry) and appends each push to the file named by the
 * broker setting telemetry.receiver.file: one tab-separated line of the
 * client instance id, the terminating flag, the client id, the payload in base64 and what Kafka's
 * own (shaded) OTLP classes decode from it (metric name and kind, comma-separated). */
public class TelemetryReceiver implements MetricsReporter, ClientTelemetryExporterProvider, ClientTelemetryExporter {
    private String path;

    @Override public void configure(Map<String, ?> configs) {
        Object value = configs.get("telemetry.receiver.file");
        path = value == null ? null : value.toString();
    }
    @Override public void init(List<KafkaMetric> metrics) { }
    @Override public void metricChange(KafkaMetric metric) { }
    @Override public void metricRemoval(KafkaMetric metric) { }
    @Override public void close() { }

    @Override public ClientTelemetryExporter clientTelemetryExporter() { return this; }

    @Override public synchronized void exportMetrics(ClientTelemetryContext context, ClientTelemetryPayload payload) {
        ByteBuffer data = payload.data().duplicate();
        byte[] bytes = new byte[data.remaining()];
        data.get(bytes);
        List<String> decoded = new ArrayList<>();
        try {
            for (ResourceMetrics resource : MetricsData.parseFrom(bytes).getResourceMetricsList()) {
                for (ScopeMetrics scope : resource.getScopeMetricsList()) {
                    for (Metric metric : scope.getMetricsList()) {
                        decoded.add(metric.getName() + ":" + metric.getDataCase());
                    }
                }
            }
        } catch (IOException e) {
            decoded.add("UNPARSABLE:" + e.getMessage());
        }
        String line = payload.clientInstanceId() + "\t" + payload.isTerminating() + "\t"
            + context.authorizableRequestContext().clientId() + "\t"
            + Base64.getEncoder().encodeToString(bytes) + "\t" + String.join(",", decoded) + "\n";
        try (FileWriter out = new FileWriter(path, true)) {
            out.write(line);
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }
}
