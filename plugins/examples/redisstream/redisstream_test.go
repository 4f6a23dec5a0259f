package redisstream_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/examples/redisstream"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

func TestMain(m *testing.M) { plugintest.Main(m) }

// redisURL is the Redis the tests use: $REDIS_URL, else the machine's.
func redisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// target makes two fresh streams on the Redis at url and reads them back
// with another client, entry by entry, the way a Watermill redisstream
// subscriber decodes them.
func target(t testing.TB, url string) *plugintest.Target {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v (start it, or set $REDIS_URL)", opts.Addr, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	base := "ferry_test_" + hex.EncodeToString(b)
	tg := &plugintest.Target{Default: base + "_default", Routed: base + "_routed"}
	t.Cleanup(func() { client.Del(context.Background(), tg.Default, tg.Routed) })
	tg.SinkYAML = func(stream string) string { return "url: " + url + "\nstream: " + stream }
	tg.Received = func() []plugintest.Record {
		var out []plugintest.Record
		for _, stream := range []string{tg.Default, tg.Routed} {
			entries, err := client.XRange(context.Background(), stream, "-", "+").Result()
			if err != nil {
				t.Errorf("XRANGE %s: %v", stream, err)
				return nil
			}
			for _, e := range entries {
				m, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
				if err != nil {
					t.Errorf("entry %s of %s: %v", e.ID, stream, err)
					continue
				}
				out = append(out, plugintest.Record{Destination: stream, Stream: stream, ID: m.UUID, Payload: m.Payload, Headers: m.Metadata})
			}
		}
		return out
	}
	return tg
}

// contract is the contract tier on the Redis at url: a topic is a stream,
// read entry by entry by another client the way a Watermill redisstream
// subscriber decodes them. No PostgreSQL, no pipeline.
func contract(url string) plugintest.SinkContract {
	return plugintest.SinkContract{
		New: func(t testing.TB, topic string) plugins.Sink {
			cfg := redisstream.DefaultConfig()
			cfg.URL, cfg.Stream, cfg.Timeout = url, topic, 2*time.Second
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := redisstream.New(cfg, plugins.Env{Pipeline: "contract", Logger: plugintest.Logger()})
			t.Cleanup(func() { s.Close() })
			return s
		},
		Read: func(t testing.TB, topic string) <-chan plugintest.Record {
			return plugintest.Poll(t, readStream(t, url, topic))
		},
		// XADD keeps a re-sent event id as a second entry; streams have no
		// record key.
		Features: plugintest.SinkFeatures{},
		Timeout:  2 * time.Second,
	}
}

// readStream returns what the stream holds so far, reading only the
// entries added since its last call; the stream is deleted when the test
// ends.
func readStream(t testing.TB, url, stream string) func() []plugintest.Record {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v (start it, or set $REDIS_URL)", opts.Addr, err)
	}
	t.Cleanup(func() {
		client.Del(context.Background(), stream)
		client.Close()
	})
	var mu sync.Mutex
	var recs []plugintest.Record
	from := "-"
	return func() []plugintest.Record {
		mu.Lock()
		defer mu.Unlock()
		// An error (Redis down) leaves what was read; the next call
		// carries on from there.
		entries, _ := client.XRangeN(context.Background(), stream, from, "+", 1000).Result()
		for _, e := range entries {
			from = "(" + e.ID
			m, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(e.Values)
			if err != nil {
				t.Errorf("entry %s of %s: %v", e.ID, stream, err)
				continue
			}
			recs = append(recs, plugintest.Record{Destination: stream, Stream: stream, ID: m.UUID, Payload: m.Payload, Headers: m.Metadata})
		}
		return slices.Clone(recs)
	}
}

// TestContract runs the contract tier on the machine's Redis. It cannot be
// stopped (other tests share it), so the broker-down scenario is skipped
// there; TestContractOwnServer runs it.
func TestContract(t *testing.T) { plugintest.RunSinkContract(t, contract(redisURL())) }

// TestContractOwnServer runs the contract tier on a redis-server of its
// own, which the broker-down scenario stops and starts.
func TestContractOwnServer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	srv := startRedis(t)
	c := contract(srv.url())
	c.Stop = func(t testing.TB) func(testing.TB) {
		srv.stop(t)
		return srv.start
	}
	plugintest.RunSinkContract(t, c)
}

// harness runs the pipeline tier (an xid8 outbox on PostgreSQL) on the
// machine's Redis.
var harness = plugintest.SinkHarness{
	Type:     redisstream.Name,
	Features: plugintest.SinkFeatures{},
	Target:   func(t testing.TB) *plugintest.Target { return target(t, redisURL()) },
}

// TestPipeline runs the pipeline tier on the machine's Redis, whose target
// has no Stop: the broker-down scenario is skipped there
// (TestPipelineOwnServer runs it).
func TestPipeline(t *testing.T) { plugintest.RunSinkPipeline(t, harness) }

// TestPipelineOwnServer runs the pipeline tier on a redis-server of each
// scenario's own, which the broker-down scenario stops and starts.
func TestPipelineOwnServer(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	h := harness
	h.Target = func(t testing.TB) *plugintest.Target {
		srv := startRedis(t)
		tg := target(t, srv.url())
		tg.Stop = func(t testing.TB) func(testing.TB) {
			srv.stop(t)
			return srv.start
		}
		return tg
	}
	plugintest.RunSinkPipeline(t, h)
}

// ownRedis is a redis-server on a free port, its data in a temporary
// directory; every write is on disk before Redis replies (appendfsync
// always), so a stop and start keeps every confirmed entry.
type ownRedis struct {
	port int
	dir  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

func startRedis(t testing.TB) *ownRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &ownRedis{port: ln.Addr().(*net.TCPAddr).Port, dir: t.TempDir()}
	ln.Close()
	r.start(t)
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *ownRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// start runs the server and waits until it answers.
func (r *ownRedis) start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	r.cmd = cmd
	opts, _ := redis.ParseURL(r.url())
	client := redis.NewClient(opts)
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for client.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %d does not answer", r.port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop shuts the server down (SIGTERM) and waits for it to exit.
func (r *ownRedis) stop(t testing.TB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	_ = r.cmd.Wait()
	r.cmd = nil
}

// TestConfig: the sink's section as `ferry run` loads it: each problem
// named by its YAML path, a password never shown.
func TestConfig(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // the paths the problems name; none: valid
	}{
		{"defaults", "stream: orders", nil},
		{"all set", "url: redis://:secret@127.0.0.1:6379/1\nstream: orders\nmax_len: 1000\ntimeout: 2s", nil},
		{"no stream", "url: redis://127.0.0.1:6379/0", []string{"sink.stream"}},
		{"not a redis url", "url: http://:secret@example.com\nstream: orders", []string{"sink.url"}},
		{"negative max_len, zero timeout", "stream: orders\nmax_len: -1\ntimeout: 0s", []string{"sink.max_len", "sink.timeout"}},
		{"unknown key", "stream: orders\nstreams: [a]", []string{"streams"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := plugintest.LoadSinkConfig(redisstream.Name, c.yaml)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded, want problems naming %v", c.want)
			}
			for _, path := range c.want {
				if !strings.Contains(err.Error(), path) {
					t.Errorf("problems %q do not name %s", err, path)
				}
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("a problem shows the password: %v", err)
			}
		})
	}
}

// benchSink is a started sink on a fresh stream of the machine's Redis.
func benchSink(b *testing.B) *redisstream.Sink {
	tg := target(b, redisURL())
	s := plugintest.BuildSink(b, harness, tg.SinkYAML(tg.Default)).(*redisstream.Sink)
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

func benchEvents(b *testing.B, batches int) [][]*message.Message {
	out := make([][]*message.Message, batches)
	for i := range out {
		out[i] = make([]*message.Message, 100)
		for j := range out[i] {
			m := message.NewMessage(fmt.Sprintf("bench-%d-%d-%d", b.N, i, j), []byte(`{"order_id":"o-1","total":"12.50","currency":"EUR"}`))
			m.Metadata.Set(plugins.MetaAggregateType, "order")
			m.Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("order-%d", j))
			m.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
			out[i][j] = m
		}
	}
	return out
}

// BenchmarkPublish: 100 events published by 100 concurrent Publish calls
// (a pipeline's window today), reported per event.
//
//	go test ./plugins/examples/redisstream -run '^$' -bench 'Publish' -benchtime 100x
func BenchmarkPublish(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublish(b, s, benchEvents(b, b.N))
}

// BenchmarkPublishBatch: the same 100 events as one PublishBatch call (one
// pipelined round trip).
func BenchmarkPublishBatch(b *testing.B) {
	s := benchSink(b)
	plugintest.BenchmarkPublishBatch(b, s, benchEvents(b, b.N))
}
