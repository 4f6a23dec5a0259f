package httpapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/pipelines"
)

// writeEvents commits n events over aggs aggregates, one transaction each.
func writeEvents(t *testing.T, f *controlFixture, n, aggs int) []sourcetest.Written {
	t.Helper()
	ctx := context.Background()
	out := make([]sourcetest.Written, 0, n)
	for i := range n {
		w, err := sourcetest.Insert(ctx, f.e.Pool, fmt.Sprintf("agg-%d", i%aggs))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, w)
	}
	return out
}

// assertExactly checks that got holds each of want exactly once, nothing
// else, and each aggregate's events in increasing sequence.
func assertExactly(t *testing.T, what string, want []sourcetest.Written, got []sourcetest.Delivered) {
	t.Helper()
	wantIDs := map[int64]bool{}
	for _, w := range want {
		wantIDs[w.OutboxID] = true
	}
	seen := map[int64]int{}
	last := map[string]int{}
	var unknown []int64
	var disorder []string
	for _, d := range got {
		seen[d.OutboxID]++
		if !wantIDs[d.OutboxID] {
			unknown = append(unknown, d.OutboxID)
		}
		if d.Seq <= last[d.Aggregate] && len(disorder) < 5 {
			disorder = append(disorder, fmt.Sprintf("%s: seq %d after %d", d.Aggregate, d.Seq, last[d.Aggregate]))
		}
		last[d.Aggregate] = max(last[d.Aggregate], d.Seq)
	}
	var missing, twice []int64
	for _, w := range want {
		switch seen[w.OutboxID] {
		case 0:
			missing = append(missing, w.OutboxID)
		case 1:
		default:
			twice = append(twice, w.OutboxID)
		}
	}
	if len(missing)+len(twice)+len(unknown)+len(disorder) > 0 {
		t.Fatalf("%s: %d missing %v, %d twice %v, %d unexpected %v, order %v", what,
			len(missing), missing[:min(10, len(missing))], len(twice), twice[:min(10, len(twice))], len(unknown), unknown[:min(10, len(unknown))], disorder)
	}
}

// waitStopped waits until the pipeline runs no more on this instance (a
// paused store pipeline leaves the supervisor once drained).
func (f *controlFixture) waitStopped(t *testing.T, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, name+" stopped", func() bool {
		st, err := f.sup.Status(name)
		return err != nil || st.State == pipelines.StatePaused
	})
}

// xid8: deliver 1,000 events, pause, reset to the creation time of the
// 501st, resume: exactly the last 500 arrive again, in per-aggregate
// order; the reset is refused while the pipeline runs, and audited.
func TestResetXid8ToTime(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_RS", 100*time.Millisecond, f.e.Subject+".rs")
	if r := f.do(t, "PUT", "/api/v1/pipelines/rs/config", adminToken, "application/yaml", f.pipelineYAML("rs", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 1000, 20)
	coll.WaitFor(t, 60*time.Second, "1000 events", func(m []testenv.Received) bool { return len(m) >= 1000 })
	sourcetest.Check(written, sourcetest.Decode(t, coll.All()), true).Assert(t, 0)
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[500].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"to": "time", "time": %q}`, cut.Format(time.RFC3339Nano))

	// Running: refused, nothing moves.
	if r := f.do(t, "PATCH", "/api/v1/pipelines/rs/offsets", adminToken, "application/json", body); r.code != 409 || !strings.Contains(string(r.raw), "pause it first") {
		t.Fatalf("reset while running: %d %s", r.code, r.raw)
	}
	// The cursor is at the last event once it is recorded.
	testenv.Eventually(t, 10*time.Second, "the cursor at the last event", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/rs/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return r.code == 200 && fmt.Sprint(pos["id"]) == fmt.Sprint(written[999].OutboxID) && r.body["newest_delivered_created_at"] != nil
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/rs/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "rs")
	dry := f.do(t, "PATCH", "/api/v1/pipelines/rs/offsets?dry_run=true", adminToken, "application/json", body)
	if dry.code != 200 || dry.body["resend_events"] != 500.0 || dry.body["skip_events"] != 0.0 || dry.body["applied"] != false {
		t.Fatalf("dry run: %d %s", dry.code, dry.raw)
	}
	// JetStream drops a re-send whose Nats-Msg-Id it saw within the
	// stream's duplicate window: wait until it forgot the first deliveries.
	waitDedupForgotten(t, f.e.NATS, f.e.Subject+".rs")
	r := f.do(t, "PATCH", "/api/v1/pipelines/rs/offsets", adminToken, "application/json", body)
	if r.code != 200 || r.body["resend_events"] != 500.0 || r.body["applied"] != true {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	t.Logf("reset to %s: %s", cut.Format(time.RFC3339Nano), r.raw)
	if r := f.do(t, "POST", "/api/v1/pipelines/rs/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 500 events after the time again", func(m []testenv.Received) bool { return len(m) >= 1502 })
	// Nothing more comes: the cursor was recorded at the last event.
	testenv.Eventually(t, 10*time.Second, "the cursor at the last event again", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/rs/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return fmt.Sprint(pos["id"]) == fmt.Sprint(written[999].OutboxID)
	})
	var replayed []testenv.Received
	for _, m := range coll.All()[1000:] {
		if m.Header.Get("probe") == "" {
			replayed = append(replayed, m)
		}
	}
	assertExactly(t, "after the reset", written[500:], sourcetest.Decode(t, replayed))
	a := f.do(t, "GET", "/api/v1/audit?pipeline=rs", adminToken, "", "")
	if !strings.Contains(string(a.raw), `"action": "offsets_reset"`) || !strings.Contains(string(a.raw), `resend_events`) {
		t.Fatalf("audit: %s", a.raw)
	}
}

// xid8 forward: 900 events wait while paused; a reset to the position of
// the 600th skips 500 of them; the skipped never arrive, the rest do.
func TestResetXid8ForwardSkip(t *testing.T) {
	f := startControl(t, adminToken)
	ctx := context.Background()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_SK", 0, f.e.Subject+".sk")
	if r := f.do(t, "PUT", "/api/v1/pipelines/sk/config", adminToken, "application/yaml", f.pipelineYAML("sk", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	first := writeEvents(t, f, 100, 10)
	coll.WaitFor(t, 60*time.Second, "100 events", func(m []testenv.Received) bool { return len(m) >= 100 })
	if r := f.do(t, "POST", "/api/v1/pipelines/sk/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "sk")
	written := append(first, writeEvents(t, f, 900, 10)...)
	var xact string
	if err := f.e.Pool.QueryRow(ctx, `SELECT xact_id::text FROM outbox WHERE id = $1`, written[599].OutboxID).Scan(&xact); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"to": "position", "position": {"xact_id": %q, "id": %d}}`, xact, written[599].OutboxID)
	r := f.do(t, "PATCH", "/api/v1/pipelines/sk/offsets", adminToken, "application/json", body)
	if r.code != 200 || r.body["skip_events"] != 500.0 || r.body["resend_events"] != 0.0 {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	t.Logf("forward reset: %s", r.raw)
	if r := f.do(t, "POST", "/api/v1/pipelines/sk/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 400 events past the position", func(m []testenv.Received) bool {
		return len(m) >= 500 && slices.ContainsFunc(m, func(r testenv.Received) bool { return r.Header.Get("outbox_id") == fmt.Sprint(written[999].OutboxID) })
	})
	// xid8 delivers in cursor order: once the last arrived, nothing before it can.
	all := sourcetest.Decode(t, coll.All())
	assertExactly(t, "before the pause", first, all[:100])
	assertExactly(t, "after the skip", written[600:], all[100:])
}

// Bad reset requests are refused with the field named, before anything
// is looked at on the database.
func TestResetBadInput(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	if r := f.do(t, "PUT", "/api/v1/pipelines/bad/config", adminToken, "application/yaml", f.pipelineYAML("bad", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/bad/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		body string
		code int
		path string
	}{
		{`{"to": "time", "time": "` + future + `"}`, 422, "time"},
		{`{"to": "time", "time": "yesterday"}`, 422, "time"},
		{`{"to": "time"}`, 422, "time"},
		{`{"to": "latest", "tim": "2026-01-01T00:00:00Z"}`, 400, "tim"},
		{`{"to": "sometime"}`, 422, "to"},
		{`{"to": "position", "position": {"lsn": "0/16B3748"}}`, 422, "position.lsn"},
		{`{"to": "position", "position": {"xact_id": "x", "id": 1}}`, 422, "position.xact_id"},
		{`{"to": "position"}`, 422, "position"},
		{`{"to": "latest", "position": {"id": 1}}`, 422, "position"},
	} {
		r := f.do(t, "PATCH", "/api/v1/pipelines/bad/offsets", adminToken, "application/json", c.body)
		details, _ := r.body["details"].([]any)
		path := ""
		if len(details) > 0 {
			path, _ = details[0].(map[string]any)["path"].(string)
		}
		if r.code != c.code || path != c.path {
			t.Errorf("%s: %d path %q, want %d %q: %s", c.body, r.code, path, c.code, c.path, r.raw)
		}
	}
	if r := f.do(t, "PATCH", "/api/v1/pipelines/bad/offsets?dry_run=maybe", adminToken, "application/json", `{"to":"latest"}`); r.code != 400 {
		t.Errorf("dry_run=maybe: %d %s", r.code, r.raw)
	}
}

// waitDedupForgotten publishes a probe to subject and waits until the
// stream no longer takes the same probe for a duplicate: every id
// published before the probe has then left the duplicate window too.
func waitDedupForgotten(t *testing.T, url, subject string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msg := &nats.Msg{Subject: subject, Header: nats.Header{"probe": {"1"}, nats.MsgIdHdr: {"probe-" + subject}}, Data: []byte("{}")}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the stream's duplicate window to pass", func() bool {
		ack, err := js.PublishMsg(ctx, msg)
		return err == nil && !ack.Duplicate
	})
}
