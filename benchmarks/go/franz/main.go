// Command franz is franz-go's reader in asyncconsumer's benchmarks (benchmarks/franz.py builds and
// runs it).  It reads as the Python readers of benchmarks/clients.py do: every partition of one
// topic assigned from the beginning (no consumer group), kgo's defaults otherwise, every record
// touched (the lengths of its key and value added up).
//
//	franz read    --bootstrap H:P --topic T --partitions 4 --count N
//	franz latency --bootstrap H:P --topic T --partitions 4 --count N --out FILE [--fetch-max-wait-ms MS]
//
// read prints one JSON object: the fields of benchmarks/clients.py's readers, plus the records/s
// of every interval of at least --interval-ms (500) and their "warm" rate, the median of the last
// three, as benchmarks/steady.py takes the warm JVM's from ConsumerPerformance's detailed stats.
//
// latency reads records whose value starts with the producer's clock (big-endian int64 ns since
// the epoch) and a flag byte (1: measured, 0: warm-up), takes the wall clock once per
// PollFetches, and writes one big-endian int64 per measured record (hand-out time less the
// record's stamp, ns) to --out once it has --count measured records.  It prints READY after its
// first records and a JSON object like read's at the end.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type result struct {
	Client       string    `json:"client"`
	Topic        string    `json:"topic"`
	Expected     int       `json:"expected"`
	Records      int       `json:"records"`
	PayloadBytes int64     `json:"payload_bytes"`
	PayloadKind  string    `json:"payload_kind"`
	WallS        float64   `json:"wall_s"`
	FirstRecordS *float64  `json:"first_record_s"`
	RecordsPerS  float64   `json:"records_per_s"`
	MBPerS       float64   `json:"mb_per_s"`
	CPUS         float64   `json:"cpu_s"`
	PeakRSSMB    float64   `json:"peak_rss_mb"`
	PID          int       `json:"pid"`
	Error        *string   `json:"error"`
	Version      string    `json:"version"`
	Intervals    []float64 `json:"intervals"`
	IntervalMS   int       `json:"interval_ms"`
	WarmPerS     *float64  `json:"warm_records_per_s"`
}

// lastIntervals is how many of the last intervals the warm rate is the median of.
const lastIntervals = 3

func cpuSeconds() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return float64(u.Utime.Sec+u.Stime.Sec) + float64(u.Utime.Usec+u.Stime.Usec)/1e6
}

// peakRSSMB is VmHWM, as the Python readers report it.
func peakRSSMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%f", &kb)
			return kb / 1024
		}
	}
	return 0
}

func franzVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/twmb/franz-go" {
				return dep.Version
			}
		}
	}
	return "?"
}

func median(values []float64) float64 {
	sorted := append([]float64(nil), values...)
	sort.Float64s(sorted)
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func newClient(bootstrap, topic string, partitions int, extra ...kgo.Opt) (*kgo.Client, error) {
	offsets := make(map[int32]kgo.Offset, partitions)
	for p := 0; p < partitions; p++ {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
	}, extra...)
	return kgo.NewClient(opts...)
}

func fetchError(fetches kgo.Fetches) error {
	for _, e := range fetches.Errors() {
		return fmt.Errorf("fetch of %s[%d]: %w", e.Topic, e.Partition, e.Err)
	}
	return nil
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "read" && os.Args[1] != "latency") {
		fmt.Fprintln(os.Stderr, "usage: franz read|latency --bootstrap H:P --topic T --partitions N --count N ...")
		os.Exit(2)
	}
	mode := os.Args[1]
	flags := flag.NewFlagSet(mode, flag.ExitOnError)
	bootstrap := flags.String("bootstrap", "", "bootstrap server host:port")
	topic := flags.String("topic", "", "topic")
	partitions := flags.Int("partitions", 4, "partitions, all assigned from the beginning")
	count := flags.Int("count", 0, "records to read (latency: measured records)")
	intervalMS := flags.Int("interval-ms", 500, "read: length of the rate intervals")
	out := flags.String("out", "", "latency: where the latencies go")
	maxWaitMS := flags.Int("fetch-max-wait-ms", -1, "latency: kgo.FetchMaxWait (default: kgo's)")
	timeoutS := flags.Float64("timeout", 300, "give up after this many seconds")
	flags.Parse(os.Args[2:])

	res := result{Client: "franz-go", Topic: *topic, Expected: *count, PayloadKind: "kv", PID: os.Getpid(),
		Version: franzVersion(), IntervalMS: *intervalMS, Intervals: []float64{}}
	var err error
	cpu0 := cpuSeconds()
	start := time.Now()
	if mode == "read" {
		err = read(&res, *bootstrap, *topic, *partitions, *count, time.Duration(*intervalMS)*time.Millisecond, *timeoutS)
	} else {
		var extra []kgo.Opt
		if *maxWaitMS >= 0 {
			extra = append(extra, kgo.FetchMaxWait(time.Duration(*maxWaitMS)*time.Millisecond))
		}
		err = latency(&res, *bootstrap, *topic, *partitions, *count, *out, *timeoutS, extra)
	}
	if err != nil {
		message := err.Error()
		res.Error = &message
	}
	res.CPUS = cpuSeconds() - cpu0
	if res.WallS == 0 {
		res.WallS = time.Since(start).Seconds()
	}
	if res.WallS > 0 {
		res.RecordsPerS = float64(res.Records) / res.WallS
		res.MBPerS = float64(res.PayloadBytes) / res.WallS / 1e6
	}
	res.PeakRSSMB = peakRSSMB()
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
	if err != nil {
		os.Exit(1)
	}
}

// read: client creation to the last record, as the Python readers' wall time.
func read(res *result, bootstrap, topic string, partitions, count int, interval time.Duration, timeoutS float64) error {
	start := time.Now()
	client, err := newClient(bootstrap, topic, partitions)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutS*float64(time.Second)))
	defer cancel()
	n, payload := 0, int64(0)
	var last time.Time
	lastReport, lastN := start, 0
	for n < count {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("read %d of %d records in %.0f s", n, count, timeoutS)
		}
		if err := fetchError(fetches); err != nil {
			return err
		}
		had := n
		fetches.EachRecord(func(r *kgo.Record) {
			if n < count {
				n++
				payload += int64(len(r.Key) + len(r.Value))
			}
		})
		if n == had {
			continue
		}
		last = time.Now()
		if had == 0 {
			first := last.Sub(start).Seconds()
			res.FirstRecordS = &first
			lastReport, lastN = last, 0 // intervals start at the first record, as the tool's after its join
		} else if elapsed := last.Sub(lastReport); elapsed >= interval {
			res.Intervals = append(res.Intervals, float64(n-lastN)/elapsed.Seconds())
			lastReport, lastN = last, n
		}
	}
	res.Records, res.PayloadBytes = n, payload
	res.WallS = last.Sub(start).Seconds()
	if k := len(res.Intervals); k > 0 {
		warm := median(res.Intervals[max(0, k-lastIntervals):])
		res.WarmPerS = &warm
	}
	return nil
}

func latency(res *result, bootstrap, topic string, partitions, count int, out string, timeoutS float64,
	extra []kgo.Opt) error {
	start := time.Now()
	client, err := newClient(bootstrap, topic, partitions, extra...)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(timeoutS*float64(time.Second)))
	defer cancel()
	latencies := make([]int64, 0, count)
	n, payload := 0, int64(0)
	for len(latencies) < count {
		fetches := client.PollFetches(ctx)
		now := time.Now().UnixNano()
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d measured records in %.0f s", len(latencies), count, timeoutS)
		}
		if err := fetchError(fetches); err != nil {
			return err
		}
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			payload += int64(len(r.Key) + len(r.Value))
			if len(r.Value) >= 9 && r.Value[8] == 1 {
				latencies = append(latencies, now-int64(binary.BigEndian.Uint64(r.Value)))
			}
		})
		if n > 0 && n == fetches.NumRecords() {
			fmt.Println("READY") // after the first records
		}
	}
	res.Records, res.PayloadBytes = n, payload
	res.WallS = time.Since(start).Seconds()
	file, err := os.Create(out)
	if err != nil {
		return err
	}
	defer file.Close()
	w := bufio.NewWriter(file)
	if err := binary.Write(w, binary.BigEndian, latencies); err != nil {
		return err
	}
	return w.Flush()
}
