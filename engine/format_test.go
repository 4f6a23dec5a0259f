package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// TestCloudEventsDeadLetterIsRaw: from a real outbox, good rows arrive as
// CloudEvents; a row no CloudEvent can hold (no event type) goes to the
// dead-letter topic as the source read it — not encoded, which would fail
// again — with the reason, and does not block the rows behind it.
func TestCloudEventsDeadLetterIsRaw(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	prefix := strings.ToLower(e.Stream)
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_CE", 0, prefix+".>")
	rows := []string{"OrderPlaced", "", "OrderShipped"}
	for i, typ := range rows {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', $1, $2, $3)`,
			fmt.Sprintf("o-%d", i), typ, fmt.Sprintf(`{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	run(t, fmt.Sprintf(`name: ce
source: {type: xid8, dsn: %q, poll_interval: 20ms}
sink:
  type: nats
  url: %q
  subject: %[3]s.events
  format: cloudevents
  cloudevents: {type_prefix: com.example.}
dead_letter: {topic: %[3]s.dlq}
`, e.DSN, e.NATS, prefix))
	coll.WaitFor(t, 60*time.Second, "2 events and 1 dead letter", func(m []testenv.Received) bool { return len(m) >= 3 })
	cfg, err := pgx.ParseConfig(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	// The default source names the database and table, never the DSN's
	// credentials.
	wantSource := "ferry://" + cfg.Database + "/outbox"
	var events []string
	for _, r := range coll.All() {
		switch {
		case strings.HasSuffix(r.Subject, ".events"):
			if got := r.Header.Get("ce-source"); got != wantSource {
				t.Errorf("ce-source %q, want %q", got, wantSource)
			}
			events = append(events, r.Header.Get("ce-type")+" "+r.Header.Get("ce-subject")+" "+string(r.Data))
		case strings.HasSuffix(r.Subject, ".dlq"):
			if got := r.Header.Get("dead_letter_reason"); got != "no_type" {
				t.Errorf("dead letter reason %q (%s), want no_type", got, r.Header.Get("dead_letter_error"))
			}
			if r.Header.Get("ce-specversion") != "" || string(r.Data) != `{"n": 1}` || r.Header.Get("aggregate_id") != "o-1" {
				t.Errorf("dead letter not raw: headers %v, body %q", r.Header, r.Data)
			}
		default:
			t.Errorf("unexpected subject %s", r.Subject)
		}
	}
	// Two aggregates: Ferry keeps order within one, not across them.
	slices.Sort(events)
	want := []string{`com.example.OrderPlaced o-0 {"n": 0}`, `com.example.OrderShipped o-2 {"n": 2}`}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", events, want)
	}
}
