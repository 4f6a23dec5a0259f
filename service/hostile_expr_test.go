package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// addressSpaceKiB is the address space an instance under attack may map
// (ulimit -v): room for the relay, a sixth of the machine. An expression
// that made the process allocate without bound ends it there, fast,
// instead of pressing the machine.
const addressSpaceKiB = 4 << 20

// boundedFerry starts instances as the ferry command (built without the
// race detector, which needs far more address space) under
// addressSpaceKiB.
func boundedFerry(t *testing.T) func(args []string, env ...string) *exec.Cmd {
	bin := ferryBinary(t)
	return func(args []string, env ...string) *exec.Cmd {
		script := fmt.Sprintf(`ulimit -v %d && exec "$0" run "$@"`, addressSpaceKiB)
		cmd := exec.Command("sh", append([]string{"-c", script, bin}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
}

// TestHostileExpression plays team-b's filter expressions that took the
// whole process down — a terabyte asked of repeat, a string doubled 45
// times by + inside reduce — and the ones that would hold a core: nested
// loops, a megabyte scanned fifty thousand times. Against a real `ferry
// run --store` with a bounded address space, each fails only its event,
// which goes to team-b's dead-letter topic with reason expression_limit;
// the process lives, and team-a's pipeline delivers every event, in
// order, before, during and after.
func TestHostileExpression(t *testing.T) {
	h := startHostileWith(t, boundedFerry(t))
	coll := testenv.CollectStream(t, h.a.NATS, strings.ToUpper(testenv.Name("hostexpr")), 100*time.Millisecond, "team-a.>", "team-b.>")
	written := writeOutbox(t, h.a, "a-agg", 20)
	coll.WaitFor(t, 60*time.Second, "team-a's first 20 events", func(m []testenv.Received) bool { return countSubject(m, "team-a.orders") >= 20 })

	bombs := map[string]string{
		"b-repeat": `len(repeat(repeat("x", 999999), 999999)) > 0`,
		"b-double": `len(reduce(1..45, #acc + #acc, type)) > 0`,
		"b-loops":  `all(1..100000, all(1..100000, true))`,
		"b-scan":   `let s = repeat("x", 1000000); all(1..49999, indexOf(s, "y") < 0)`,
	}
	// Each pipeline reads a table of its own: one event read by all four
	// would have one event id, which JetStream stores once.
	bPool := mustPool(t, h.bDSN)
	for name, expr := range bombs {
		table := strings.ReplaceAll(name, "-", "_")
		ddl, _ := xid8.Schema(table)
		_, err := bPool.Exec(context.Background(), ddl)
		must(t, err)
		y := fmt.Sprintf("name: %s\nsource: {type: xid8, dsn: \"${DB_URL}\", table: %s, poll_interval: 20ms}\n"+
			"transforms: [{type: filter, expr: %q}]\nsink: {type: nats, url: %q, subject: team-b.orders}\ndead_letter: {topic: team-b.dlq}\n",
			name, table, expr, h.a.NATS)
		if code, body := h.call("POST", "/api/v1/pipelines", "tenant:team-b", y); code != 201 {
			t.Fatalf("team-b's pipeline %s: %d %s", name, code, body)
		}
		_, err = bPool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'b-1', 'OrderPlaced', '{}')`, table))
		must(t, err)
	}
	bWritten := []string{"one event a pipeline"}
	written = append(written, writeOutbox(t, h.a, "a-agg", 20)...)

	deadline := time.Now().Add(90 * time.Second)
	for countSubject(coll.All(), "team-b.dlq") < len(bombs)*len(bWritten) {
		if time.Now().After(deadline) || !h.in.alive() {
			for name := range bombs {
				_, body := h.call("GET", "/api/v1/pipelines/"+name, "admin", "")
				t.Logf("%s: %s", name, body)
			}
			t.Fatalf("team-b's event was not dead-lettered by each of its %d pipelines (%d dead letters); the instance's log:\n%s",
				len(bombs), countSubject(coll.All(), "team-b.dlq"), h.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !h.in.alive() {
		t.Fatalf("the instance exited:\n%s", h.logs.String())
	}
	for _, m := range coll.All() {
		switch m.Subject {
		case "team-b.dlq":
			if r := m.Header.Get(plugins.DeadLetterReasonHeader); r != "expression_limit" {
				t.Errorf("dead letter with reason %q (%s), want expression_limit", r, m.Header.Get(plugins.DeadLetterErrorHeader))
			}
		case "team-b.orders":
			t.Errorf("team-b's event passed a filter that could not be evaluated: %s", m.Data)
		}
	}
	for name := range bombs {
		code, body := h.call("GET", "/api/v1/pipelines/"+name, "tenant:team-b", "")
		if code != 200 || !strings.Contains(body, `"running"`) {
			t.Errorf("team-b's %s after its event was dead-lettered: %d %s", name, code, body)
		}
	}

	written = append(written, writeOutbox(t, h.a, "a-agg", 20)...)
	coll.WaitFor(t, 60*time.Second, "team-a's 60 events", func(m []testenv.Received) bool { return countSubject(m, "team-a.orders") >= len(written) })
	checkDelivered(t, written, coll.All(), "team-a.orders")
	if !h.in.alive() {
		t.Fatalf("the instance exited:\n%s", h.logs.String())
	}
}

// checkDelivered fails t unless every written event arrived on subject,
// each aggregate's in order.
func checkDelivered(t *testing.T, written []plugintest.Written, got []testenv.Received, subject string) {
	t.Helper()
	want := map[string][]int{}
	for _, w := range written {
		want[w.Aggregate] = append(want[w.Aggregate], w.Seq)
	}
	seen := map[string][]int{}
	for _, m := range got {
		if m.Subject != subject {
			continue
		}
		var body struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(m.Data, &body); err != nil {
			t.Fatalf("an event on %s that no writer wrote: %s", subject, m.Data)
		}
		if s := seen[body.Agg]; len(s) > 0 && s[len(s)-1] >= body.Seq {
			if s[len(s)-1] == body.Seq {
				continue // a duplicate: at least once
			}
			t.Errorf("aggregate %s: seq %d after %d", body.Agg, body.Seq, s[len(s)-1])
		}
		seen[body.Agg] = append(seen[body.Agg], body.Seq)
	}
	for agg, seqs := range want {
		if fmt.Sprint(seen[agg]) != fmt.Sprint(seqs) {
			t.Errorf("aggregate %s: delivered %v, written %v", agg, seen[agg], seqs)
		}
	}
}
