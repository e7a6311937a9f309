// The Java client's own classic assignors, run on scenarios read from stdin: the reference that
// tests/support/java_assignors.py compares asyncconsumer's assignors with.
//
// One JSON scenario per line:
//   {"assignor": "range" | "roundrobin" | "sticky" | "cooperative-sticky",
//    "topics": {"t": [["a", "b"], ["c", null], ...]},       // per partition: its replicas' racks
//    "members": {"m1": {"topics": ["t"], "rack": "a" | null, "instance": "i1" | null,
//                       "owned": [["t", 0], ...], "generation": 3}}}
// One JSON answer per line: {"m1": [["t", 0], ...], ...}, or {"error": "..."}.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.kafka.clients.consumer.ConsumerPartitionAssignor;
import org.apache.kafka.clients.consumer.ConsumerPartitionAssignor.GroupSubscription;
import org.apache.kafka.clients.consumer.ConsumerPartitionAssignor.Subscription;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.RangeAssignor;
import org.apache.kafka.clients.consumer.RoundRobinAssignor;
import org.apache.kafka.clients.consumer.StickyAssignor;
import org.apache.kafka.common.Cluster;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;

public class JavaAssignors {
    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank())
                continue;
            String answer;
            try {
                answer = JSON.writeValueAsString(run(JSON.readTree(line)));
            } catch (Exception e) {
                ObjectNode error = JSON.createObjectNode();
                error.put("error", e.toString());
                answer = JSON.writeValueAsString(error);
            }
            System.out.println(answer);
            System.out.flush();
        }
    }

    private static ConsumerPartitionAssignor assignor(String name) {
        switch (name) {
            case "range": return new RangeAssignor();
            case "roundrobin": return new RoundRobinAssignor();
            case "sticky": return new StickyAssignor();
            case "cooperative-sticky": return new CooperativeStickyAssignor();
            default: throw new IllegalArgumentException("unknown assignor " + name);
        }
    }

    private static ObjectNode run(JsonNode scenario) {
        List<Node> nodes = new ArrayList<>();
        List<PartitionInfo> partitions = new ArrayList<>();
        Iterator<Map.Entry<String, JsonNode>> topics = scenario.get("topics").fields();
        while (topics.hasNext()) {
            Map.Entry<String, JsonNode> topic = topics.next();
            int index = 0;
            for (JsonNode replicaRacks : topic.getValue()) {
                List<Node> replicas = new ArrayList<>();
                for (JsonNode rack : replicaRacks) {
                    Node node = new Node(nodes.size(), "localhost", 9092, rack.isNull() ? null : rack.asText());
                    nodes.add(node);
                    replicas.add(node);
                }
                Node[] array = replicas.toArray(new Node[0]);
                partitions.add(new PartitionInfo(topic.getKey(), index++, array.length > 0 ? array[0] : null, array, array));
            }
        }
        Cluster cluster = new Cluster("cluster", nodes, partitions, new HashSet<>(), new HashSet<>());

        Map<String, Subscription> subscriptions = new HashMap<>();
        Iterator<Map.Entry<String, JsonNode>> members = scenario.get("members").fields();
        while (members.hasNext()) {
            Map.Entry<String, JsonNode> member = members.next();
            JsonNode spec = member.getValue();
            List<String> subscribed = new ArrayList<>();
            spec.get("topics").forEach(t -> subscribed.add(t.asText()));
            List<TopicPartition> owned = new ArrayList<>();
            if (spec.has("owned"))
                spec.get("owned").forEach(tp -> owned.add(new TopicPartition(tp.get(0).asText(), tp.get(1).asInt())));
            int generation = spec.has("generation") ? spec.get("generation").asInt() : -1;
            JsonNode rack = spec.get("rack");
            Subscription subscription = new Subscription(subscribed, null, owned, generation,
                    rack == null || rack.isNull() ? Optional.empty() : Optional.of(rack.asText()));
            JsonNode instance = spec.get("instance");
            if (instance != null && !instance.isNull())
                subscription.setGroupInstanceId(Optional.of(instance.asText()));
            subscriptions.put(member.getKey(), subscription);
        }

        Map<String, ConsumerPartitionAssignor.Assignment> result = assignor(scenario.get("assignor").asText())
                .assign(cluster, new GroupSubscription(subscriptions)).groupAssignment();
        ObjectNode answer = JSON.createObjectNode();
        result.forEach((member, assignment) -> {
            ArrayNode list = answer.putArray(member);
            for (TopicPartition tp : assignment.partitions()) {
                ArrayNode pair = list.addArray();
                pair.add(tp.topic());
                pair.add(tp.partition());
            }
        });
        return answer;
    }
}
