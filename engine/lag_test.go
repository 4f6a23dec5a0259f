package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// slowSink confirms every publish after a fixed delay.
type slowSink struct{ delay time.Duration }

func (s slowSink) Publish(string, ...*message.Message) error { time.Sleep(s.delay); return nil }
func (slowSink) Close() error                                { return nil }
func (slowSink) Start(context.Context) error                 { return nil }

type slowConfig struct {
	Delay time.Duration `yaml:"delay"`
}

func (*slowConfig) Validate() error { return nil }

func lagOf(t *testing.T, sup *engine.Supervisor, name, seg string) engine.LagSummary {
	st, err := sup.Status(name)
	if err != nil {
		t.Fatal(err)
	}
	return st.Lag[seg]
}

// A held transaction moves commit→read, not read→ack; a slow broker moves
// read→ack, not commit→read.
func TestLagSegmentsBlameTheRightStage(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	r := plugins.NewRegistry()
	xid8.Register(r)
	plugins.RegisterSink(r, "slow", func() *slowConfig { return &slowConfig{} }, func(c *slowConfig, _ plugins.Env) (plugins.Sink, error) {
		return slowSink{c.Delay}, nil
	})
	specs, err := pipelines.Loader{Registry: r}.LoadBytes("lag.yaml", []byte(fmt.Sprintf(`name: held
source: {type: xid8, dsn: %q, table: outbox, poll_interval: 10ms}
sink: {type: slow, delay: 0s}
---
name: slowbroker
source: {type: xid8, dsn: %q, table: outbox2, poll_interval: 10ms}
sink: {type: slow, delay: 800ms}
`, e.DSN, e.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	ddl, _ := xid8.Schema("outbox2")
	if _, err := e.Pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()

	// held: a transaction with an xid stays open 1.5s while a row commits.
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('o', '1', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the delay under test
	tx.Rollback(ctx)
	testenv.Eventually(t, 60*time.Second, "held event delivered", func() bool { return lagOf(t, sup, "held", plugins.SegmentReadToAck).Count == 1 })

	// slowbroker: the broker takes 800ms to confirm.
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox2 (aggregate_type, aggregate_id, type, payload) VALUES ('o', '1', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "slow event delivered", func() bool {
		return lagOf(t, sup, "slowbroker", plugins.SegmentReadToAck).Count == 1
	})

	held := func(seg string) float64 { return lagOf(t, sup, "held", seg).P99 }
	slow := func(seg string) float64 { return lagOf(t, sup, "slowbroker", seg).P99 }
	t.Logf("held:       commit→read %.3fs  read→ack %.3fs  commit→ack %.3fs", held("commit_to_read"), held("read_to_ack"), held("commit_to_ack"))
	t.Logf("slowbroker: commit→read %.3fs  read→ack %.3fs  commit→ack %.3fs", slow("commit_to_read"), slow("read_to_ack"), slow("commit_to_ack"))
	switch {
	case held(plugins.SegmentCommitToRead) < 1.2 || held(plugins.SegmentReadToAck) > 0.5:
		t.Errorf("held transaction: commit→read %.3fs (want ≥ 1.2s), read→ack %.3fs (want < 0.5s)", held(plugins.SegmentCommitToRead), held(plugins.SegmentReadToAck))
	case held(plugins.SegmentCommitToAck) < 1.2:
		t.Errorf("held transaction: commit→ack %.3fs, want ≥ 1.2s", held(plugins.SegmentCommitToAck))
	case slow(plugins.SegmentReadToAck) < 0.7 || slow(plugins.SegmentCommitToRead) > 0.5:
		t.Errorf("slow broker: read→ack %.3fs (want ≥ 0.7s), commit→read %.3fs (want < 0.5s)", slow(plugins.SegmentReadToAck), slow(plugins.SegmentCommitToRead))
	}
}
