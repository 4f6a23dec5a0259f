package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/xid8"
)

// A source that delivers but cannot record its progress is not healthy: a
// restart would send everything again. The pipeline is backing_off with the
// cause until progress is recorded again, and then running.
func TestProgressNotRecordedIsNotHealthy(t *testing.T) {
	for _, c := range []struct {
		name    string
		harness plugintest.SourceHarness
		// breaks makes recording progress fail; fix undoes it.
		breaks, fix, cause string
	}{
		{"xid8", plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema},
			`ALTER TABLE ferry_offsets RENAME TO ferry_offsets_away`, `ALTER TABLE ferry_offsets_away RENAME TO ferry_offsets`,
			`record progress`},
		{"poll", plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema},
			`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'outbox is read-only'; END $$;
			 CREATE TRIGGER refuse BEFORE UPDATE ON outbox FOR EACH ROW WHEN (NEW.published_at IS NOT NULL) EXECUTE FUNCTION refuse()`,
			`DROP TRIGGER refuse ON outbox`,
			`mark delivered rows`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := relaytest.Setup(t, c.harness)
			ctx := context.Background()
			specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(e.YAML("orders", 100)))
			if err != nil {
				t.Fatal(err)
			}
			sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sup.Run(runCtx, specs) }()
			defer func() { cancel(); <-done }()
			insert := func(prefix string, n int) {
				for i := range n {
					if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
						t.Fatal(err)
					}
				}
			}
			insert("before", 3)
			e.Coll.WaitFor(t, 30*time.Second, "3 events", func(m []testenv.Received) bool { return len(m) >= 3 })
			if _, err := e.Pool.Exec(ctx, c.breaks); err != nil {
				t.Fatal(err)
			}
			insert("during", 3)
			e.Coll.WaitFor(t, 30*time.Second, "3 more events, still delivered", func(m []testenv.Received) bool { return len(m) >= 6 })
			testenv.Eventually(t, 30*time.Second, "backing_off naming the cause", func() bool {
				st := status(t, sup, "orders")
				return st.State == engine.StateBackingOff && strings.Contains(st.LastError, c.cause)
			})
			if _, err := e.Pool.Exec(ctx, c.fix); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, "running again", func() bool {
				return status(t, sup, "orders").State == engine.StateRunning
			})
		})
	}
}

// A row whose headers column is not a JSON object is delivered without
// those headers, and says so in a header the consumer sees.
func TestUnreadableHeadersAreVisible(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	if _, err := e.Pool.Exec(ctx, `ALTER TABLE outbox ALTER headers TYPE text`); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{`nope`, `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`} {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload, headers) VALUES ('order', 'o-1', 'T', '{}', $1)`, h); err != nil {
			t.Fatal(err)
		}
	}
	e.Start(t, e.YAML("headers", 100))
	e.Coll.WaitFor(t, 30*time.Second, "2 events", func(m []testenv.Received) bool { return len(m) >= 2 })
	got := e.Coll.All()
	if why := got[0].Header.Get(plugins.MetaHeadersError); !strings.Contains(why, "not a JSON object") {
		t.Errorf("first event's %s header %q, want the reason", plugins.MetaHeadersError, why)
	}
	if got[1].Header.Get(plugins.MetaHeadersError) != "" || got[1].Header.Get("traceparent") == "" {
		t.Errorf("second event's headers %v, want its traceparent and no error", got[1].Header)
	}
}
