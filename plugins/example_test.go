package plugins_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// stdoutConfig is a sink's config: yaml tags, defaults in its constructor,
// every problem reported by Validate.
type stdoutConfig struct {
	Prefix string `yaml:"prefix"`
}

func (c *stdoutConfig) Validate() error {
	var p plugins.Problems
	if strings.TrimSpace(c.Prefix) == "" {
		p.Add("prefix", "must not be empty")
	}
	return p.Err()
}

// stdoutSink "publishes" by printing: Publish returns once every message
// is written, which is this broker's confirmation.
type stdoutSink struct{ cfg *stdoutConfig }

func (s *stdoutSink) Start(context.Context) error { return nil }
func (s *stdoutSink) Close() error                { return nil }
func (s *stdoutSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("%s %s key=%s %s\n", s.cfg.Prefix, topic, plugins.Key(m), m.Payload)
	}
	return nil
}

// A sink registers a default config and a constructor that does no I/O;
// the pipeline builds it through the registry, starts it, and publishes.
func ExampleRegisterSink() {
	r := plugins.NewRegistry()
	plugins.RegisterSink(r, "stdout", func() *stdoutConfig { return &stdoutConfig{Prefix: ">"} },
		func(c *stdoutConfig, _ plugins.Env) (plugins.Sink, error) { return &stdoutSink{cfg: c}, nil })

	f, ok := r.Lookup(plugins.KindSink, "stdout")
	if !ok {
		panic("stdout is not registered")
	}
	sink, err := f.BuildSink(f.NewConfig(), plugins.Env{Pipeline: "orders"})
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	if err := sink.Start(context.Background()); err != nil {
		panic(err)
	}
	msg := message.NewMessage("ev-1", []byte(`{"total":42}`))
	msg.Metadata.Set(plugins.MetaAggregateID, "order-7")
	_ = sink.Publish("orders.placed", msg)
	// Output: > orders.placed key=order-7 {"total":42}
}

// Building is typed: a factory builds only its own kind, and only from its
// own config; anything else is an error.
func ExampleFactory_BuildSink() {
	r := plugins.NewRegistry()
	plugins.RegisterSink(r, "stdout", func() *stdoutConfig { return &stdoutConfig{Prefix: ">"} },
		func(c *stdoutConfig, _ plugins.Env) (plugins.Sink, error) { return &stdoutSink{cfg: c}, nil })
	registerUpper(r, "upper")

	sinkFactory, _ := r.Lookup(plugins.KindSink, "stdout")
	upper, _ := r.Lookup(plugins.KindTransform, "upper")

	_, err := sinkFactory.BuildSource(sinkFactory.NewConfig(), plugins.Env{})
	fmt.Println(err)
	_, err = sinkFactory.BuildSink(upper.NewConfig(), plugins.Env{})
	fmt.Println(err)
	// Output:
	// plugins: sink "stdout" cannot build a source
	// plugins: sink "stdout" wants a *plugins_test.stdoutConfig config, got *plugins_test.upperConfig
}

// A config reports every problem at once, each naming the key as written
// in YAML, so the loader can point at file and line.
func ExampleProblems() {
	cfg := &stdoutConfig{Prefix: " "}
	for _, e := range plugins.Flatten(cfg.Validate()) {
		fmt.Println(e)
	}
	// Output: prefix: must not be empty
}

// A source's messages carry the metadata later stages read; the check
// names each key that is missing or malformed.
func ExampleCheckSourceMetadata() {
	msg := message.NewMessage("0b6f8d9e-2a49-4d1c-9a55-6c1f0e7d3a10", []byte(`{}`))
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	msg.Metadata.Set(plugins.MetaAggregateType, "order")
	msg.Metadata.Set(plugins.MetaAggregateID, "order-7")
	msg.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
	msg.Metadata.Set(plugins.MetaCreatedAt, plugins.FormatTime(now))
	msg.Metadata.Set(plugins.MetaReadAt, plugins.FormatTime(now.Add(time.Second)))
	msg.Metadata.Set(plugins.MetaOutboxID, "7")
	msg.Metadata.Set(plugins.MetaPosition, "812/7")
	fmt.Println(plugins.CheckSourceMetadata(msg))

	msg.Metadata.Set(plugins.MetaReadAt, "12:00")
	delete(msg.Metadata, plugins.MetaOutboxID)
	fmt.Println(plugins.CheckSourceMetadata(msg))
	// Output:
	// <nil>
	// read_at: "12:00" is not an RFC 3339 time (FormatTime): the read_to_ack lag and stage latencies start there
	// outbox_id: not set: dead letters and the formats identify the row by it
}

// lockedConfig is a source config that takes part in high availability:
// its pipelines are owned by one instance at a time, locked on its database.
type lockedConfig struct{ DSN string }

func (*lockedConfig) Validate() error  { return nil }
func (c *lockedConfig) HA() plugins.HA { return plugins.HA{LockDSN: c.DSN} }

// High availability is a capability a source config declares; one that
// does not cannot be owned by one instance (and `ownership:` is an error).
func ExampleSourceHA() {
	for _, cfg := range []plugins.Config{&lockedConfig{DSN: "postgres://db/app"}, &stdoutConfig{}} {
		ha := plugins.SourceHA(cfg)
		fmt.Printf("%T exclusive=%t shared=%t\n", cfg, ha.Exclusive(), ha.Shared)
	}
	// Output:
	// *plugins_test.lockedConfig exclusive=true shared=false
	// *plugins_test.stdoutConfig exclusive=false shared=false
}

// A PostgreSQL source reports the xmin horizon among its details; the
// JSON keeps it as the top-level xmin_horizon_age_seconds.
func ExampleHealth_MarshalJSON() {
	h := plugins.Health{Backlog: 12, BacklogUnit: "events", OldestAge: 3 * time.Second,
		Details:   map[string]any{"cursor": "812/7", plugins.DetailXminHorizonAge: 90 * time.Second},
		CheckedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	b, _ := json.Marshal(h)
	fmt.Println(string(b))
	fmt.Println(h.XminHorizonAge())
	// Output:
	// {"backlog":12,"backlog_unit":"events","oldest_age_seconds":3,"xmin_horizon_age_seconds":90,"details":{"cursor":"812/7"},"checked_at":"2026-03-01T12:00:00Z"}
	// 1m30s
}
