package httpapi_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
)

// writeEvents commits n events over aggs aggregates, one transaction each.
func writeEvents(t *testing.T, f *controlFixture, n, aggs int) []plugintest.Written {
	t.Helper()
	ctx := context.Background()
	out := make([]plugintest.Written, 0, n)
	for i := range n {
		w, err := plugintest.Insert(ctx, f.e.Pool, fmt.Sprintf("agg-%d", i%aggs))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, w)
	}
	return out
}

// assertExactly checks that got holds each of want exactly once, nothing
// else, and each aggregate's events in increasing sequence.
func assertExactly(t *testing.T, what string, want []plugintest.Written, got []plugintest.Delivered) {
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
		return err != nil || st.State == engine.StatePaused
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
	plugintest.Check(written, relaytest.Decode(t, coll.All()), true).Assert(t, 0)
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
	testenv.Eventually(t, 60*time.Second, "the cursor at the last event", func() bool {
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
	testenv.Eventually(t, 60*time.Second, "the cursor at the last event again", func() bool {
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
	assertExactly(t, "after the reset", written[500:], relaytest.Decode(t, replayed))
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
	if r := f.do(t, "PATCH", "/api/v1/pipelines/sk/offsets?dry_run=true", adminToken, "application/json", `{"to": "latest"}`); r.code != 200 || r.body["skip_events"] != 900.0 {
		t.Fatalf("dry run to latest: %d %s", r.code, r.raw)
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
	all := relaytest.Decode(t, coll.All())
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

func startPollControl(t *testing.T) *controlFixture {
	t.Helper()
	return startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema})
}

func (f *controlFixture) pollYAML(name, extra string) string {
	return fmt.Sprintf("name: %s\nsource: {type: poll, dsn: %q, poll_interval: 20ms%s}\nsink: {type: nats, url: %q, subject: %s.%s}\n",
		name, f.e.DSN, extra, f.e.NATS, f.e.Subject, name)
}

// poll: deliver 1,000 events, pause, reset to the creation time of the
// 501st, resume: exactly the last 500 arrive again, in per-aggregate order.
func TestResetPollToTime(t *testing.T) {
	f := startPollControl(t)
	ctx := context.Background()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_PR", 100*time.Millisecond, f.e.Subject+".pr")
	if r := f.do(t, "PUT", "/api/v1/pipelines/pr/config", adminToken, "application/yaml", f.pollYAML("pr", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 1000, 20)
	coll.WaitFor(t, 60*time.Second, "1000 events", func(m []testenv.Received) bool { return len(m) >= 1000 })
	plugintest.Check(written, relaytest.Decode(t, coll.All()), true).Assert(t, 0)
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[500].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"to": "time", "time": %q}`, cut.Format(time.RFC3339Nano))
	if r := f.do(t, "PATCH", "/api/v1/pipelines/pr/offsets", adminToken, "application/json", body); r.code != 409 {
		t.Fatalf("reset while running: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "every row marked", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/pr/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return r.code == 200 && pos["unpublished_events"] == 0.0 && r.body["newest_delivered_created_at"] != nil
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/pr/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "pr")
	waitDedupForgotten(t, f.e.NATS, f.e.Subject+".pr")
	r := f.do(t, "PATCH", "/api/v1/pipelines/pr/offsets", adminToken, "application/json", body)
	if r.code != 200 || r.body["resend_events"] != 500.0 || r.body["skip_events"] != 0.0 || r.body["applied"] != true {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	t.Logf("poll reset to %s: %s", cut.Format(time.RFC3339Nano), r.raw)
	if r := f.do(t, "PATCH", "/api/v1/pipelines/pr/offsets?dry_run=true", adminToken, "application/json", `{"to": "latest"}`); r.code != 200 || r.body["skip_events"] != 500.0 {
		t.Fatalf("dry run to latest: %d %s", r.code, r.raw)
	}
	pos := fmt.Sprintf(`{"to": "position", "position": {"id": %d}}`, written[699].OutboxID)
	if r := f.do(t, "PATCH", "/api/v1/pipelines/pr/offsets?dry_run=true", adminToken, "application/json", pos); r.code != 200 || r.body["skip_events"] != 200.0 || r.body["resend_events"] != 0.0 {
		t.Fatalf("dry run to a position: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/pr/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 500 events after the time again", func(m []testenv.Received) bool { return len(m) >= 1502 })
	testenv.Eventually(t, 60*time.Second, "every row marked again", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/pr/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return pos["unpublished_events"] == 0.0
	})
	var replayed []testenv.Received
	for _, m := range coll.All()[1000:] {
		if m.Header.Get("probe") == "" {
			replayed = append(replayed, m)
		}
	}
	assertExactly(t, "after the reset", written[500:], relaytest.Decode(t, replayed))
}

// poll dead letters: oversize events are parked; once the stream takes
// them, a replay (first two, then the rest) delivers each exactly once.
func TestPollDeadLetterReplay(t *testing.T) {
	f := startPollControl(t)
	ctx := context.Background()
	subject := f.e.Subject + ".dl"
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_DL", 0, subject)
	nc, err := nats.Connect(f.e.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	setMax := func(n int32) {
		s, err := js.Stream(ctx, f.e.Stream+"_DL")
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		cfg.MaxMsgSize = n
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setMax(512)
	if r := f.do(t, "PUT", "/api/v1/pipelines/dl/config", adminToken, "application/yaml", f.pollYAML("dl", ", max_attempts: 1")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	var small, big []int64
	for i := range 20 {
		pad := 0
		if i%4 == 1 {
			pad = 2000
		}
		var id int64
		if err := f.e.Pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', $1, 'T', jsonb_build_object('agg', $1::text, 'seq', 1, 'pad', repeat('x', $2))) RETURNING id`,
			fmt.Sprintf("a%d", i), pad).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if pad > 0 {
			big = append(big, id)
		} else {
			small = append(small, id)
		}
	}
	coll.WaitFor(t, 30*time.Second, "the small events", func(m []testenv.Received) bool { return len(m) >= len(small) })
	var listed map[string]any
	testenv.Eventually(t, 30*time.Second, "5 dead letters", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/dl/dead-letters?reason=Size+Exceeds", adminToken, "", "")
		listed = r.body
		return r.code == 200 && r.body["total"] == 5.0
	})
	dls := listed["dead_letters"].([]any)
	first := dls[0].(map[string]any)
	if len(dls) != 5 || first["outbox_id"] != float64(big[0]) || first["attempts"] != 1.0 || !strings.Contains(first["reason"].(string), "message size exceeds maximum") {
		t.Fatalf("dead letters: %v", listed)
	}
	if r := f.do(t, "GET", "/api/v1/pipelines/dl/dead-letters?reason=nothing-like-it", adminToken, "", ""); r.body["total"] != 0.0 {
		t.Fatalf("reason filter: %s", r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "offsets: 5 parked, nothing else waiting", func() bool {
		off := f.do(t, "GET", "/api/v1/pipelines/dl/offsets", adminToken, "", "")
		pos := off.body["position"].(map[string]any)
		return pos["dead_lettered_events"] == 5.0 && pos["unpublished_events"] == 0.0 && off.body["newest_delivered_created_at"] != nil
	})
	setMax(-1) // the fix
	r := f.do(t, "POST", "/api/v1/pipelines/dl/dead-letters/replay?limit=2&dry_run=true", adminToken, "", "")
	if r.code != 200 || fmt.Sprint(r.body["outbox_ids"]) != fmt.Sprint([]float64{float64(big[0]), float64(big[1])}) {
		t.Fatalf("dry replay: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/dl/dead-letters/replay?limit=2", adminToken, "", ""); r.code != 200 || r.body["replayed_events"] != 2.0 {
		t.Fatalf("replay 2: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/dl/dead-letters/replay?reason=size+exceeds", adminToken, "", ""); r.code != 200 || r.body["replayed_events"] != 3.0 {
		t.Fatalf("replay the rest: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 30*time.Second, "every event", func(m []testenv.Received) bool { return len(m) >= 20 })
	testenv.Eventually(t, 60*time.Second, "no dead letter left and every row marked", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/dl/offsets", adminToken, "", "")
		pos := r.body["position"].(map[string]any)
		return pos["dead_lettered_events"] == 0.0 && pos["unpublished_events"] == 0.0
	})
	seen := map[int64]int{}
	for _, d := range relaytest.Decode(t, coll.All()) {
		seen[d.OutboxID]++
	}
	for _, id := range append(small, big...) {
		if seen[id] != 1 {
			t.Errorf("outbox id %d arrived %d times", id, seen[id])
		}
	}
	if len(seen) != 20 {
		t.Errorf("%d distinct events, want 20", len(seen))
	}
	t.Logf("dead letters: %d parked, replayed 2 + 3, each delivered once", len(big))
}

// wal: the slot only moves forward. Going back to an LSN is refused with
// the reason (going back to a time is TestResetWalToTime); {"to": "latest"} while paused skips what waits in the
// WAL: the skipped events never arrive, the ones after do.
// Both slot modes: the default, shared (the pipeline's row moves; the
// slot is its other members' too), and a slot of its own.
func TestResetWalForwardOnly(t *testing.T) {
	for _, m := range walModes {
		t.Run(m.name, func(t *testing.T) { resetWalForwardOnly(t, m) })
	}
}

// walMode is a slot mode of the wal source, as a pipeline's YAML sets it.
type walMode struct {
	name, yaml string
	shared     bool
}

var walModes = []walMode{{"shared", "", true}, {"own", ", slot_mode: own", false}}

// position reads a wal pipeline's position from its offsets: a shared
// member's row once its initial snapshot was delivered, or its own slot's.
func (m walMode) position(pos map[string]any, pipeline string) (string, bool) {
	if m.shared {
		lsn, _ := pos["member_confirmed_lsn"].(string)
		return lsn, pos["slot_mode"] == "shared" && lsn != "" && pos["initial_snapshot_pending"] == false
	}
	lsn, _ := pos["confirmed_flush_lsn"].(string)
	return lsn, pos["slot_mode"] == "own" && pos["slot"] == "ferry_"+pipeline && lsn != ""
}

func resetWalForwardOnly(t *testing.T, m walMode) {
	f := startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_WL", 0, f.e.Subject+".wl")
	y := fmt.Sprintf("name: wl\nsource: {type: wal, dsn: %q%s}\nsink: {type: nats, url: %q, subject: %s.wl}\n", f.e.DSN, m.yaml, f.e.NATS, f.e.Subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/wl/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	first := writeEvents(t, f, 100, 10)
	coll.WaitFor(t, 60*time.Second, "100 events", func(m []testenv.Received) bool { return len(m) >= 100 })
	testenv.Eventually(t, 30*time.Second, "the position in the offsets", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/wl/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		_, ok := m.position(pos, "wl")
		return r.code == 200 && ok && pos["retained_wal_bytes"] != nil
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/wl/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "wl")
	skipped := writeEvents(t, f, 50, 10) // never to arrive
	for _, c := range []struct{ body, path, says string }{
		{`{"to": "position", "position": {"lsn": "0/10"}}`, "position.lsn", "cannot go back"},
		{`{"to": "position", "position": {"xact_id": "1", "id": 1}}`, "position.xact_id", "lsn"},
	} {
		r := f.do(t, "PATCH", "/api/v1/pipelines/wl/offsets", adminToken, "application/json", c.body)
		if r.code != 422 || !strings.Contains(string(r.raw), c.says) || !strings.Contains(string(r.raw), `"path": "`+c.path+`"`) {
			t.Errorf("%s: %d %s", c.body, r.code, r.raw)
		}
	}
	r := f.do(t, "PATCH", "/api/v1/pipelines/wl/offsets", adminToken, "application/json", `{"to": "latest"}`)
	if r.code != 200 || r.body["applied"] != true || !strings.Contains(fmt.Sprint(r.body["note"]), "bytes of WAL") {
		t.Fatalf("reset to latest: %d %s", r.code, r.raw)
	}
	t.Logf("wal reset to latest: %s", r.raw)
	after := writeEvents(t, f, 20, 10)
	if r := f.do(t, "POST", "/api/v1/pipelines/wl/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	last := fmt.Sprint(after[len(after)-1].OutboxID)
	coll.WaitFor(t, 60*time.Second, "the events after the reset", func(m []testenv.Received) bool {
		return slices.ContainsFunc(m, func(r testenv.Received) bool { return r.Header.Get("outbox_id") == last })
	})
	all := relaytest.Decode(t, coll.All())
	assertExactly(t, "before the pause", first, all[:100])
	assertExactly(t, "after the skip", after, all[100:]) // none of skipped
	t.Logf("wal: %d skipped, %d delivered after the reset", len(skipped), len(after))
}

// poll backfill beside live traffic at 500 ev/s: the 300 earlier events
// arrive once more, each marked ferry-replay; every live event arrives
// once, each aggregate's live events in order, and so are the re-sent.
func TestPollBackfillDuringLiveTraffic(t *testing.T) {
	f := startPollControl(t)
	ctx := context.Background()
	subject := f.e.Subject + ".bf"
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_BF", 100*time.Millisecond, subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/bf/config", adminToken, "application/yaml", f.pollYAML("bf", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	old := writeEvents(t, f, 300, 10)
	coll.WaitFor(t, 60*time.Second, "300 events", func(m []testenv.Received) bool { return len(m) >= 300 })
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	waitDedupForgotten(t, f.e.NATS, subject)
	// Live traffic: 1,000 events at 500 a second over the same aggregates.
	liveDone := make(chan []plugintest.Written, 1)
	go func() {
		var live []plugintest.Written
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for i := range 1000 {
			<-tick.C
			w, err := plugintest.Insert(ctx, f.e.Pool, fmt.Sprintf("agg-%d", i%10))
			if err != nil {
				t.Error(err)
				break
			}
			live = append(live, w)
		}
		liveDone <- live
	}()
	coll.WaitFor(t, 30*time.Second, "live traffic flowing", func(m []testenv.Received) bool { return len(m) >= 450 })
	body := fmt.Sprintf(`{"to": %q}`, cut.Format(time.RFC3339Nano))
	if r := f.do(t, "POST", "/api/v1/pipelines/bf/backfill?dry_run=true", adminToken, "application/json", body); r.code != 200 || r.body["backfill_events"] != 300.0 {
		t.Fatalf("dry backfill: %d %s", r.code, r.raw)
	}
	r := f.do(t, "POST", "/api/v1/pipelines/bf/backfill", adminToken, "application/json", body)
	if r.code != 200 || r.body["backfill_events"] != 300.0 {
		t.Fatalf("backfill: %d %s", r.code, r.raw)
	}
	live := <-liveDone
	if len(live) != 1000 {
		t.Fatalf("%d live events written", len(live))
	}
	coll.WaitFor(t, 60*time.Second, "old, live and backfilled events", func(m []testenv.Received) bool { return len(m) >= 300+1000+300+2 })
	var first, replayed, fresh []testenv.Received
	for i, m := range coll.All() {
		switch {
		case m.Header.Get("probe") != "":
		case i < 300:
			first = append(first, m)
		case m.Header.Get("ferry-replay") == "true":
			replayed = append(replayed, m)
		default:
			fresh = append(fresh, m)
		}
	}
	assertExactly(t, "first delivery", old, relaytest.Decode(t, first))
	assertExactly(t, "live traffic", live, relaytest.Decode(t, fresh))
	assertExactly(t, "backfilled", old, relaytest.Decode(t, replayed))
	t.Logf("backfill beside 1000 live events at 500/s: %d re-sent with ferry-replay, %d live, each once, per-aggregate order kept", len(replayed), len(fresh))
}

// decodeKafka reads the events of Kafka records as relaytest.Decode
// reads NATS messages.
func decodeKafka(t *testing.T, recs []*kgo.Record) []plugintest.Delivered {
	t.Helper()
	msgs := make([]testenv.Received, 0, len(recs))
	for _, r := range recs {
		h := nats.Header{}
		for _, kv := range r.Headers {
			h.Set(kv.Key, string(kv.Value))
		}
		msgs = append(msgs, testenv.Received{Header: h, Data: r.Value})
	}
	return relaytest.Decode(t, msgs)
}

// poll to Kafka: 400 events, reset to the 201st's time while paused, the
// last 200 arrive again, every id once, each aggregate in order.
func TestResetPollToTimeKafka(t *testing.T) {
	f := startPollControl(t)
	ctx := context.Background()
	srv := testenv.StartKafka(t)
	topic := strings.ToLower(f.e.Stream) + "-reset"
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 1)
	coll := testenv.CollectKafka(t, []string{srv.Addr()}, []string{topic})
	y := fmt.Sprintf("name: pk\nsource: {type: poll, dsn: %q, poll_interval: 20ms}\nsink: {type: kafka, brokers: [%q], topic: %s}\n", f.e.DSN, srv.Addr(), topic)
	if r := f.do(t, "PUT", "/api/v1/pipelines/pk/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 400, 10)
	testenv.Eventually(t, 60*time.Second, "400 records", func() bool { return coll.Len() >= 400 })
	assertExactly(t, "first delivery", written, decodeKafka(t, coll.All()))
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[200].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "every row marked", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/pk/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return pos["unpublished_events"] == 0.0
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/pk/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	r := f.do(t, "PATCH", "/api/v1/pipelines/pk/offsets", adminToken, "application/json", fmt.Sprintf(`{"to": "time", "time": %q}`, cut.Format(time.RFC3339Nano)))
	if r.code != 200 || r.body["resend_events"] != 200.0 {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/pk/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "the 200 records again", func() bool { return coll.Len() >= 600 })
	testenv.Eventually(t, 60*time.Second, "every row marked again", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/pk/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return pos["unpublished_events"] == 0.0
	})
	assertExactly(t, "after the reset", written[200:], decodeKafka(t, coll.All()[400:]))
}

// A file pipeline paused on this instance is reset like a store one: to
// the start, it sends every event again.
func TestResetFilePipeline(t *testing.T) {
	f := startControl(t, adminToken)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/p.yaml", []byte(f.pipelineYAML("ff", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	f.conv.LoadFiles = func() ([]*pipelines.Spec, error) { return pipelines.Load(dir) }
	if _, err := f.conv.ReloadFiles(); err != nil {
		t.Fatal(err)
	}
	subject := f.e.Subject + ".ff"
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_FF", 100*time.Millisecond, subject)
	written := writeEvents(t, f, 50, 5)
	coll.WaitFor(t, 60*time.Second, "50 events", func(m []testenv.Received) bool { return len(m) >= 50 })
	if r := f.do(t, "POST", "/api/v1/pipelines/ff/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	waitDedupForgotten(t, f.e.NATS, subject)
	r := f.do(t, "PATCH", "/api/v1/pipelines/ff/offsets", adminToken, "application/json", `{"to": "position", "position": {"xact_id": "0", "id": 0}}`)
	if r.code != 200 || r.body["resend_events"] != 50.0 {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/ff/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "50 events again", func(m []testenv.Received) bool { return len(m) >= 102 })
	var again []testenv.Received
	for _, m := range coll.All()[50:] {
		if m.Header.Get("probe") == "" {
			again = append(again, m)
		}
	}
	assertExactly(t, "after the reset", written, relaytest.Decode(t, again))
}
