package httpapi_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// backfillDuringLive delivers 300 events, then writes 1,000 more at 500 a
// second over the same aggregates and, while they flow, backfills the
// first 300 by time: each of those arrives once more marked ferry-replay;
// every live event arrives once, and each aggregate's live events — and its
// backfilled ones — in order. It returns the backfill's answer.
func backfillDuringLive(t *testing.T, f *controlFixture, name, yaml string) response {
	t.Helper()
	ctx := context.Background()
	subject := f.e.Subject + "." + name
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_"+strings.ToUpper(name), 100*time.Millisecond, subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/"+name+"/config", adminToken, "application/yaml", yaml); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	old := writeEvents(t, f, 300, 10)
	coll.WaitFor(t, 60*time.Second, "300 events", func(m []testenv.Received) bool { return len(m) >= 300 })
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	waitDedupForgotten(t, f.e.NATS, subject)
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
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/backfill?dry_run=true", adminToken, "application/json", body); r.code != 200 || r.body["backfill_events"] != 300.0 {
		t.Fatalf("dry backfill: %d %s", r.code, r.raw)
	}
	r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/backfill", adminToken, "application/json", body)
	if r.code != 200 || r.body["backfill_events"] != 300.0 {
		t.Fatalf("backfill: %d %s", r.code, r.raw)
	}
	live := <-liveDone
	if len(live) != 1000 {
		t.Fatalf("%d live events written", len(live))
	}
	coll.WaitFor(t, 90*time.Second, "old, live and backfilled events", func(m []testenv.Received) bool {
		n := 0
		for _, r := range m {
			if r.Header.Get("probe") == "" {
				n++
			}
		}
		return n >= 300+1000+300
	})
	var first, replayed, fresh []testenv.Received
	interleaved, pendingLive := 0, 0 // live events that arrived between backfilled ones
	for i, m := range coll.All() {
		switch {
		case m.Header.Get("probe") != "":
		case i < 300:
			first = append(first, m)
		case m.Header.Get("ferry-replay") == "true":
			if len(replayed) > 0 {
				interleaved += pendingLive
			}
			pendingLive = 0
			replayed = append(replayed, m)
		default:
			pendingLive++
			fresh = append(fresh, m)
		}
	}
	assertExactly(t, "first delivery", old, relaytest.Decode(t, first))
	assertExactly(t, "live traffic", live, relaytest.Decode(t, fresh))
	assertExactly(t, "backfilled", old, relaytest.Decode(t, replayed))
	a := f.do(t, "GET", "/api/v1/audit?pipeline="+name, adminToken, "", "")
	if !strings.Contains(string(a.raw), `"action": "backfill"`) {
		t.Fatalf("audit: %s", a.raw)
	}
	t.Logf("%s backfill beside 1000 live events at 500/s: %d re-sent with ferry-replay, %d live (%d of them arrived between backfilled ones), each once, per-aggregate order kept",
		name, len(replayed), len(fresh), interleaved)
	return r
}

// xid8: the running source reads the backfill in its loop and sends the
// rows beside the live ones.
func TestXid8BackfillDuringLiveTraffic(t *testing.T) {
	f := startControl(t, adminToken)
	backfillDuringLive(t, f, "xb", f.pipelineYAML("xb", ""))
	// Done: the request is finished and its row list gone.
	testenv.Eventually(t, 30*time.Second, "the backfill finished", func() bool {
		var open, rows int
		err := f.e.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM ferry_backfills WHERE finished_at IS NULL),
			(SELECT count(*) FROM ferry_backfill_rows)`).Scan(&open, &rows)
		return err == nil && open == 0 && rows == 0
	})
}

// wal on a slot of its own: the backfill waits until the stream read past
// the request, then the rows still in the table are read through the
// snapshot's decoder and sent beside the streamed ones.
func TestWalBackfillDuringLiveTraffic(t *testing.T) {
	f := startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	y := fmt.Sprintf("name: wb\nsource: {type: wal, dsn: %q, slot_mode: own}\nsink: {type: nats, url: %q, subject: %s.wb}\n", f.e.DSN, f.e.NATS, f.e.Subject)
	backfillDuringLive(t, f, "wb", y)
}

// wal with the default slot_mode, shared: the backfill goes through the
// shared stream's one check for requests, and is sent beside the stream
// the same way.
func TestWalSharedBackfillDuringLiveTraffic(t *testing.T) {
	f := startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	y := fmt.Sprintf("name: wbs\nsource: {type: wal, dsn: %q}\nsink: {type: nats, url: %q, subject: %s.wbs}\n", f.e.DSN, f.e.NATS, f.e.Subject)
	backfillDuringLive(t, f, "wbs", y)
}

// A backfill of nothing is refused for a filter, finished at once for a
// range that holds no delivered row, and a filter on an unknown field is a
// 4xx naming it.
func TestXid8BackfillBadInput(t *testing.T) {
	f := startControl(t, adminToken)
	if r := f.do(t, "PUT", "/api/v1/pipelines/xe/config", adminToken, "application/yaml", f.pipelineYAML("xe", "")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	for _, c := range []struct {
		body string
		code int
		says string
	}{
		{`{}`, 422, "give a time range"},
		{`{"aggregate": "x"}`, 400, "aggregate"},
		{fmt.Sprintf(`{"from": %q}`, time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), 422, "in the future"},
	} {
		if r := f.do(t, "POST", "/api/v1/pipelines/xe/backfill", adminToken, "application/json", c.body); r.code != c.code || !strings.Contains(string(r.raw), c.says) {
			t.Errorf("%s: %d %s", c.body, r.code, r.raw)
		}
	}
	r := f.do(t, "POST", "/api/v1/pipelines/xe/backfill", adminToken, "application/json", `{"aggregate_id": "none"}`)
	if r.code != 200 || r.body["backfill_events"] != 0.0 {
		t.Fatalf("empty backfill: %d %s", r.code, r.raw)
	}
}

// wal going back in time: deliver 1,000 events, pause, write 50 more
// (waiting in the WAL), reset to the creation time of the 501st: the dry
// run counts the 550 rows it reads again; on resume exactly the last 500
// and the 50 arrive, each once, in per-aggregate order — the rows read
// again first, then the slot's stream without the listed rows it sends
// again — and events written after the resume follow. A reset replaced by
// a later one before the resume is not sent.
// Both slot modes: the default, shared, and a slot of its own.
func TestResetWalToTime(t *testing.T) {
	for _, m := range walModes {
		t.Run(m.name, func(t *testing.T) { resetWalToTime(t, m) })
	}
}

func resetWalToTime(t *testing.T, m walMode) {
	f := startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	ctx := context.Background()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_WT", 100*time.Millisecond, f.e.Subject+".wt")
	y := fmt.Sprintf("name: wt\nsource: {type: wal, dsn: %q%s}\nsink: {type: nats, url: %q, subject: %s.wt}\n", f.e.DSN, m.yaml, f.e.NATS, f.e.Subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/wt/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 1000, 20)
	coll.WaitFor(t, 60*time.Second, "1000 events", func(m []testenv.Received) bool { return len(m) >= 1000 })
	assertExactly(t, "first delivery", written, relaytest.Decode(t, coll.All()))
	var cut time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[500].OutboxID).Scan(&cut); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"to": "time", "time": %q}`, cut.Format(time.RFC3339Nano))
	if r := f.do(t, "PATCH", "/api/v1/pipelines/wt/offsets", adminToken, "application/json", body); r.code != 409 {
		t.Fatalf("reset while running: %d %s", r.code, r.raw)
	}
	// Until the initial snapshot was delivered, a stop means the next
	// start reads the snapshot again (by design): the test waits for it.
	testenv.Eventually(t, 30*time.Second, "the position after the initial snapshot in the offsets", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/wt/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		_, ok := m.position(pos, "wt")
		return r.code == 200 && ok
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/wt/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, "wt")
	waiting := writeEvents(t, f, 50, 20)
	dry := f.do(t, "PATCH", "/api/v1/pipelines/wt/offsets?dry_run=true", adminToken, "application/json", body)
	if dry.code != 200 || dry.body["resend_events"] != 550.0 || dry.body["applied"] != false {
		t.Fatalf("dry run: %d %s", dry.code, dry.raw)
	}
	waitDedupForgotten(t, f.e.NATS, f.e.Subject+".wt")
	// A reset to an earlier time, replaced by the next one before the
	// pipeline resumed: only the last one is sent.
	var start time.Time
	if err := f.e.Pool.QueryRow(ctx, `SELECT created_at FROM outbox WHERE id = $1`, written[0].OutboxID).Scan(&start); err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "PATCH", "/api/v1/pipelines/wt/offsets", adminToken, "application/json",
		fmt.Sprintf(`{"to": "time", "time": %q}`, start.Format(time.RFC3339Nano))); r.code != 200 || r.body["resend_events"] != 1050.0 {
		t.Fatalf("reset to the start: %d %s", r.code, r.raw)
	}
	r := f.do(t, "PATCH", "/api/v1/pipelines/wt/offsets", adminToken, "application/json", body)
	if r.code != 200 || r.body["resend_events"] != 550.0 || r.body["applied"] != true {
		t.Fatalf("reset: %d %s", r.code, r.raw)
	}
	t.Logf("wal reset to %s: %s", cut.Format(time.RFC3339Nano), r.raw)
	if r := f.do(t, "POST", "/api/v1/pipelines/wt/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 550 rows", func(m []testenv.Received) bool { return len(m) >= 1000+550+1 })
	after := writeEvents(t, f, 20, 20)
	last := fmt.Sprint(after[len(after)-1].OutboxID)
	coll.WaitFor(t, 60*time.Second, "the events after the resume", func(m []testenv.Received) bool {
		return slices.ContainsFunc(m, func(r testenv.Received) bool { return r.Header.Get("outbox_id") == last })
	})
	var again []testenv.Received
	for _, m := range coll.All()[1000:] {
		if m.Header.Get("probe") == "" {
			again = append(again, m)
		}
	}
	want := append(append(slices.Clone(written[500:]), waiting...), after...)
	assertExactly(t, "after the reset", want, relaytest.Decode(t, again))
	a := f.do(t, "GET", "/api/v1/audit?pipeline=wt", adminToken, "", "")
	if !strings.Contains(string(a.raw), `"action": "offsets_reset"`) {
		t.Fatalf("audit: %s", a.raw)
	}
	testenv.Eventually(t, 30*time.Second, "the reset finished", func() bool {
		var open int
		err := f.e.Pool.QueryRow(ctx, `SELECT count(*) FROM ferry_backfills WHERE finished_at IS NULL`).Scan(&open)
		return err == nil && open == 0
	})
}

// A backfill outlives a pause: paused while it is being sent, the
// pipeline goes on with it when resumed, from the progress it recorded;
// every listed row arrives marked (rows acked past the recorded progress
// may arrive twice), and the request finishes.
func TestXid8BackfillAcrossPause(t *testing.T) {
	f := startControl(t, adminToken)
	backfillAcrossPause(t, f, "bp", f.pipelineYAML("bp", ""), func(last plugintest.Written) bool {
		r := f.do(t, "GET", "/api/v1/pipelines/bp/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return fmt.Sprint(pos["id"]) == fmt.Sprint(last.OutboxID)
	})
}

// The same for wal, whose stream confirms its slot meanwhile.
func TestWalBackfillAcrossPause(t *testing.T) {
	f := startControlOn(t, adminToken, true, nil, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	y := fmt.Sprintf("name: wp\nsource: {type: wal, dsn: %q}\nsink: {type: nats, url: %q, subject: %s.wp}\n", f.e.DSN, f.e.NATS, f.e.Subject)
	backfillAcrossPause(t, f, "wp", y, func(plugintest.Written) bool { return true })
}

func backfillAcrossPause(t *testing.T, f *controlFixture, name, yaml string, delivered func(last plugintest.Written) bool) {
	t.Helper()
	ctx := context.Background()
	subject := f.e.Subject + "." + name
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_"+strings.ToUpper(name), 100*time.Millisecond, subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/"+name+"/config", adminToken, "application/yaml", yaml); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	old := writeEvents(t, f, 3000, 30)
	coll.WaitFor(t, 90*time.Second, "3000 events", func(m []testenv.Received) bool { return len(m) >= 3000 })
	testenv.Eventually(t, 20*time.Second, "the progress at the last event", func() bool { return delivered(old[len(old)-1]) })
	waitDedupForgotten(t, f.e.NATS, subject)
	replays := func(m []testenv.Received) map[int64]int {
		var rs []testenv.Received
		for _, r := range m {
			if r.Header.Get("ferry-replay") == "true" {
				rs = append(rs, r)
			}
		}
		seen := map[int64]int{}
		for _, d := range relaytest.Decode(t, rs) {
			seen[d.OutboxID]++
		}
		return seen
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/backfill", adminToken, "application/json", `{"aggregate_type": "order"}`); r.code != 200 || r.body["backfill_events"] != 3000.0 {
		t.Fatalf("backfill: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "part of the backfill", func(m []testenv.Received) bool { return len(replays(m)) >= 200 })
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, name)
	var sent, total int64
	if err := f.e.Pool.QueryRow(ctx, `SELECT sent, total FROM ferry_backfills WHERE pipeline = $1`, name).Scan(&sent, &total); err != nil {
		t.Fatal(err)
	}
	atPause := len(replays(coll.All()))
	t.Logf("paused with %d of %d backfilled rows arrived, %d recorded", atPause, total, sent)
	if sent == 0 {
		t.Errorf("no progress recorded at the pause")
	}
	off := f.do(t, "GET", "/api/v1/pipelines/"+name+"/offsets", adminToken, "", "")
	bfs, _ := off.body["backfills"].([]any)
	if len(bfs) != 1 || fmt.Sprint(bfs[0].(map[string]any)["sent_events"]) != fmt.Sprint(sent) || bfs[0].(map[string]any)["total_events"] != 3000.0 {
		t.Errorf("offsets while paused: %s", off.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 90*time.Second, "every backfilled row", func(m []testenv.Received) bool { return len(replays(m)) >= 3000 })
	seen := replays(coll.All())
	twice := 0
	for _, w := range old {
		switch n := seen[w.OutboxID]; {
		case n == 0:
			t.Errorf("outbox id %d never backfilled", w.OutboxID)
		case n > 1:
			twice++
		}
	}
	testenv.Eventually(t, 30*time.Second, "the backfill finished", func() bool {
		off := f.do(t, "GET", "/api/v1/pipelines/"+name+"/offsets", adminToken, "", "")
		_, listed := off.body["backfills"]
		return off.code == 200 && !listed
	})
	// (JetStream's duplicate window drops most re-sends of the rows acked
	// past the recorded progress, so twice counts only what it let through.)
	t.Logf("%s backfill across a pause: all %d rows arrived, %d seen twice", name, len(old), twice)
}

// A window of one (max_in_flight: 1, strict order) still backfills.
func TestXid8BackfillWindowOfOne(t *testing.T) {
	f := startControl(t, adminToken)
	subject := f.e.Subject + ".b1"
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_B1", 100*time.Millisecond, subject)
	y := f.pipelineYAML("b1", "") + "limits: {max_in_flight: 1}\n"
	if r := f.do(t, "PUT", "/api/v1/pipelines/b1/config", adminToken, "application/yaml", y); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	old := writeEvents(t, f, 30, 3)
	coll.WaitFor(t, 60*time.Second, "30 events", func(m []testenv.Received) bool { return len(m) >= 30 })
	testenv.Eventually(t, 20*time.Second, "the cursor at the last event", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/b1/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return fmt.Sprint(pos["id"]) == fmt.Sprint(old[len(old)-1].OutboxID)
	})
	waitDedupForgotten(t, f.e.NATS, subject)
	if r := f.do(t, "POST", "/api/v1/pipelines/b1/backfill", adminToken, "application/json", `{"aggregate_id": "agg-1"}`); r.code != 200 || r.body["backfill_events"] != 10.0 {
		t.Fatalf("backfill: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "10 backfilled", func(m []testenv.Received) bool {
		n := 0
		for _, r := range m {
			if r.Header.Get("ferry-replay") == "true" {
				n++
			}
		}
		return n >= 10
	})
	var replayed []testenv.Received
	for _, m := range coll.All() {
		if m.Header.Get("ferry-replay") == "true" {
			replayed = append(replayed, m)
		}
	}
	var want []plugintest.Written
	for i, w := range old {
		if i%3 == 1 {
			want = append(want, w)
		}
	}
	assertExactly(t, "backfilled", want, relaytest.Decode(t, replayed))
}

// backfillWithinWindow delivers 100 events into a stream with JetStream's
// default duplicate window (2 minutes) and backfills them at once, well
// within it: the stream stores each of them a second time — the backfill
// names its request in Nats-Msg-Id — with the event id intact in
// Watermill's uuid header and the replay headers set, and the pipeline
// counts no duplicate. Before, the window dropped every one of them and
// the answer still said they were queued.
func backfillWithinWindow(t *testing.T, f *controlFixture, name, yaml string) {
	t.Helper()
	subject := f.e.Subject + "." + name
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_"+strings.ToUpper(name), 0, subject)
	if r := f.do(t, "PUT", "/api/v1/pipelines/"+name+"/config", adminToken, "application/yaml", yaml); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 100, 10)
	coll.WaitFor(t, 60*time.Second, "100 events", func(m []testenv.Received) bool { return len(m) >= 100 })
	first := coll.All()
	assertExactly(t, "first delivery", written, relaytest.Decode(t, first))
	// A backfill lists the events recorded as delivered.
	testenv.Eventually(t, 20*time.Second, "the 100 events recorded as delivered", func() bool {
		r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/backfill?dry_run=true", adminToken, "application/json", `{"aggregate_type": "order"}`)
		return r.code == 200 && r.body["backfill_events"] == 100.0
	})
	r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/backfill", adminToken, "application/json", `{"aggregate_type": "order"}`)
	if r.code != 200 || r.body["backfill_events"] != 100.0 {
		t.Fatalf("backfill: %d %s", r.code, r.raw)
	}
	if n, _ := r.body["note"].(string); !strings.Contains(n, "duplicates_total") {
		t.Errorf("the answer does not say where what the broker drops is counted: %s", r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 100 events again", func(m []testenv.Received) bool { return len(m) >= 200 })
	all := coll.All()
	replayed := all[100:]
	assertExactly(t, "backfilled within the duplicate window", written, relaytest.Decode(t, replayed))
	ids := map[string]bool{}
	for _, m := range first {
		ids[m.Header.Get("_watermill_message_uuid")] = true
	}
	for _, m := range replayed {
		id, msgID := m.Header.Get("_watermill_message_uuid"), m.Header.Get("Nats-Msg-Id")
		req := m.Header.Get("ferry-replay-request")
		if !ids[id] || m.Header.Get("ferry-replay") != "true" || !strings.HasPrefix(req, "backfill-") || msgID != id+":"+req {
			t.Fatalf("a backfilled event's ids: uuid %q (first delivered: %v), Nats-Msg-Id %q, ferry-replay %q, ferry-replay-request %q",
				id, ids[id], msgID, m.Header.Get("ferry-replay"), req)
		}
	}
	st := f.do(t, "GET", "/api/v1/pipelines/"+name, adminToken, "", "")
	if st.code != 200 || st.body["duplicates_total"] != 0.0 {
		t.Errorf("status: want duplicates_total 0: %d %s", st.code, st.raw)
	}
	t.Logf("%s: 100 events backfilled within the duplicate window, all stored again (stream holds %d)", name, len(all))
}

func TestXid8BackfillWithinDuplicateWindow(t *testing.T) {
	f := startControl(t, adminToken)
	backfillWithinWindow(t, f, "xw", f.pipelineYAML("xw", ""))
}

func TestPollBackfillWithinDuplicateWindow(t *testing.T) {
	f := startPollControl(t)
	backfillWithinWindow(t, f, "pw", f.pollYAML("pw", ""))
}

// Going back within the duplicate window: 100 events delivered into a
// stream with JetStream's default window, the pipeline paused, its
// progress reset to the 50th (position gives the reset's position of an
// event); on resume the 50 after it arrive again at once — the reset marks
// them, and their Nats-Msg-Id names it — with their event ids intact, and
// events written afterwards arrive as live ones.
func resetBackWithinWindow(t *testing.T, f *controlFixture, name, yaml string, recorded func(offsets map[string]any, last plugintest.Written) bool, position func(plugintest.Written) string) {
	t.Helper()
	coll := testenv.CollectStream(t, f.e.NATS, f.e.Stream+"_"+strings.ToUpper(name), 0, f.e.Subject+"."+name)
	if r := f.do(t, "PUT", "/api/v1/pipelines/"+name+"/config", adminToken, "application/yaml", yaml); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	written := writeEvents(t, f, 100, 10)
	coll.WaitFor(t, 60*time.Second, "100 events", func(m []testenv.Received) bool { return len(m) >= 100 })
	testenv.Eventually(t, 60*time.Second, "every event recorded as delivered", func() bool {
		r := f.do(t, "GET", "/api/v1/pipelines/"+name+"/offsets", adminToken, "", "")
		pos, _ := r.body["position"].(map[string]any)
		return r.code == 200 && recorded(pos, written[99])
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/pause", adminToken, "", ""); r.code != 200 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	f.waitStopped(t, name)
	body := fmt.Sprintf(`{"to": "position", "position": %s}`, position(written[49]))
	if r := f.do(t, "PATCH", "/api/v1/pipelines/"+name+"/offsets", adminToken, "application/json", body); r.code != 200 || r.body["resend_events"] != 50.0 ||
		!strings.Contains(fmt.Sprint(r.body["note"]), "duplicates_total") {
		t.Fatalf("reset (the note says where the broker's duplicates are counted): %d %s", r.code, r.raw)
	}
	if r := f.do(t, "POST", "/api/v1/pipelines/"+name+"/resume", adminToken, "", ""); r.code != 200 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}
	coll.WaitFor(t, 60*time.Second, "the 50 events after the position again", func(m []testenv.Received) bool { return len(m) >= 150 })
	after := writeEvents(t, f, 10, 10)
	coll.WaitFor(t, 60*time.Second, "10 live events", func(m []testenv.Received) bool { return len(m) >= 160 })
	all := coll.All()
	assertExactly(t, "re-sent after the reset", written[50:], relaytest.Decode(t, all[100:150]))
	assertExactly(t, "live after the reset", after, relaytest.Decode(t, all[150:]))
	for i, m := range all[100:] {
		id, msgID := testenv.EventID(m.Header), m.Header.Get("Nats-Msg-Id")
		resend := i < 50
		if resend != strings.HasPrefix(msgID, id+":reset-") || (!resend && msgID != id) {
			t.Fatalf("message %d after the reset (re-sent: %v): Nats-Msg-Id %q, event id %q", 100+i, resend, msgID, id)
		}
	}
	if st := f.do(t, "GET", "/api/v1/pipelines/"+name, adminToken, "", ""); st.body["duplicates_total"] != 0.0 {
		t.Errorf("status: want duplicates_total 0: %s", st.raw)
	}
}

func TestXid8ResetBackWithinDuplicateWindow(t *testing.T) {
	f := startControl(t, adminToken)
	resetBackWithinWindow(t, f, "rw", f.pipelineYAML("rw", ""), func(pos map[string]any, last plugintest.Written) bool {
		return fmt.Sprint(pos["id"]) == fmt.Sprint(last.OutboxID)
	}, func(w plugintest.Written) string {
		var xact string
		if err := f.e.Pool.QueryRow(context.Background(), `SELECT xact_id::text FROM outbox WHERE id = $1`, w.OutboxID).Scan(&xact); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`{"xact_id": %q, "id": %d}`, xact, w.OutboxID)
	})
}

func TestPollResetBackWithinDuplicateWindow(t *testing.T) {
	f := startPollControl(t)
	resetBackWithinWindow(t, f, "rp", f.pollYAML("rp", ""), func(pos map[string]any, _ plugintest.Written) bool {
		return pos["unpublished_events"] == 0.0
	}, func(w plugintest.Written) string { return fmt.Sprintf(`{"id": %d}`, w.OutboxID) })
}
