package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// ferry lag and doctor take --url as --http takes its address: a URL,
// host:port, :port or a bare port. lag shows where every pipeline runs,
// the age of each backlog measurement, the next retry, the publishes the
// broker answered as duplicates, and a degraded coordination database and
// an unreachable store above the table.
func TestLagURLForms(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"pipelines": [
			{"name": "orders", "state": "standby", "owner": "ferry-b", "since": "2026-01-01T00:00:00Z", "lag": {}},
			{"name": "billing", "state": "backing_off", "owner": "ferry-a", "last_error": "read outbox: dial tcp 127.0.0.1:1: connect: connection refused",
			 "next_retry": "2999-01-01T00:00:00Z", "since": "2026-01-01T00:00:00Z", "lag": {}, "duplicates_total": 4321,
			 "health": {"backlog": 7, "backlog_unit": "events", "oldest_age_seconds": 12.5, "xmin_horizon_age_seconds": 0, "checked_at": "2026-01-01T00:00:00Z"}}],
			"coordination": {"up": false, "database": "postgres://ferry:xxxxx@db:5432/coord", "instance": "ferry-a",
			 "last_error": "dial tcp 10.0.0.9:5432: connect: connection refused", "since": "2026-01-01T00:00:00Z", "degraded": "keeps what it owns"},
			"store": {"up": false, "since": "2026-01-01T00:00:05Z", "read_at": "2026-01-01T00:00:04Z", "last_error": "dial tcp 10.0.0.8:5432: connect: connection refused"}}`))
	}))
	defer srv.Close()
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := net.SplitHostPort(hostPort)
	for _, u := range []string{srv.URL, hostPort, ":" + port, port} {
		code, out, errOut := run("lag", "--url", u)
		if code != 0 {
			t.Errorf("lag --url %s: exit %d: %s", u, code, errOut)
			continue
		}
		for _, want := range []string{"HA DEGRADED", "dial tcp 10.0.0.9:5432", "STORE DOWN since 2026-01-01T00:00:05Z: dial tcp 10.0.0.8:5432", "as last read (at 2026-01-01T00:00:04Z)", "7 events", "12.5s", "ago", "(next retry in", "DUPLICATES", "4321"} {
			if !strings.Contains(out, want) {
				t.Errorf("lag --url %s: no %q in:\n%s", u, want, out)
			}
		}
		for _, row := range [][]string{{"orders", "standby", "ferry-b"}, {"billing", "backing_off", "ferry-a"}} {
			if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool { return slices.Equal(strings.Fields(l)[:min(3, len(strings.Fields(l)))], row) }) {
				t.Errorf("lag --url %s: no row starting %v in:\n%s", u, row, out)
			}
		}
	}
}

// A usage printed after an error stands apart from it; --help prints the
// usage alone; the top-level help has its blank line before Usage too.
func TestUsageIsSetApart(t *testing.T) {
	_, _, errOut := run("run", "--bogus")
	if !strings.Contains(errOut, "-bogus\n\nUsage: ferry run ") {
		t.Errorf("ferry run --bogus:\n%s", errOut)
	}
	_, _, errOut = run("lag", "--help")
	if !strings.HasPrefix(errOut, "Usage: ferry lag ") {
		t.Errorf("ferry lag --help:\n%s", errOut)
	}
	_, out, _ := run()
	if !strings.Contains(out, "NATS.\n\nUsage: ferry <command>") {
		t.Errorf("ferry:\n%s", out)
	}
}

// startFileInstance runs `ferry run -c dir` without a store, its admin
// token cpAdmin.
func startFileInstance(t *testing.T, name, dir string) *instance {
	t.Helper()
	in := &instance{name: name, addr: freeAddr(t)}
	args := []string{"run", "-c", dir, "--http", in.addr, "--ha=false", "--log-level", "warn", "--shutdown-timeout", "3s"}
	in.cmd = exec.Command(os.Args[0], "-test.run=^$")
	in.cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"), "FERRY_ADMIN_TOKEN="+cpAdmin)
	in.cmd.Stdout, in.cmd.Stderr = os.Stderr, os.Stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.kill() })
	testenv.Eventually(t, 30*time.Second, name+" answers", func() bool {
		code, _ := in.api("GET", "/api/v1/pipelines", "", nil)
		return code == 200
	})
	return in
}

// lagRow is the header's columns and the named pipeline's cells of a
// `ferry lag` table, cut where the header's columns start.
func lagRow(t *testing.T, out, name string) (header []string, cells map[string]string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "PIPELINE") })
	if at < 0 {
		t.Fatalf("no table in:\n%s", out)
	}
	head := lines[at]
	var starts []int
	for i := range len(head) {
		if head[i] != ' ' && (i == 0 || (head[i-1] == ' ' && i > 1 && head[i-2] == ' ')) {
			starts = append(starts, i)
		}
	}
	cut := func(line string, i int) string {
		end := len(line)
		if i+1 < len(starts) {
			end = min(starts[i+1], len(line))
		}
		if starts[i] >= len(line) {
			return ""
		}
		return strings.TrimSpace(line[starts[i]:end])
	}
	for i := range starts {
		header = append(header, cut(head, i))
	}
	for _, l := range lines[at+1:] {
		if strings.HasPrefix(l, name+" ") {
			cells = map[string]string{}
			for i, h := range header {
				cells[h] = cut(l, i)
			}
			return header, cells
		}
	}
	t.Fatalf("no row of %s in:\n%s", name, out)
	return nil, nil
}

// ferry lag reads the one API: the same pipeline, paused with rows
// waiting, run from a file without a store and then kept in a store,
// prints the same columns and the same cells — state paused, the backlog
// measured, never "-" — with --url and the token taken from $FERRY_URL
// and $FERRY_TOKEN as ferry pipelines takes them.
func TestLagSameWithAndWithoutStore(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	subject := e.Subject + ".lagged"
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_LAG", 100*time.Millisecond, subject)
	y := fmt.Sprintf("name: lagged\nsource: {type: xid8, dsn: %q, poll_interval: 20ms, metrics_interval: 1s}\nsink: {type: nats, url: %q, subject: %s}\n", e.DSN, e.NATS, subject)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lagged.yaml"), []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	insert := func(n int) {
		for i := range n {
			if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("agg-%d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("FERRY_TOKEN", cpAdmin)
	// lagWhilePaused pauses the pipeline on in, writes 2 rows and returns
	// `ferry lag` once it shows them waiting, and what `ferry doctor`
	// (without -c: the instance walks it) says of it.
	lagWhilePaused := func(in *instance, delivered int) (string, doctorVerdict) {
		t.Helper()
		coll.WaitFor(t, 30*time.Second, fmt.Sprintf("%d events", delivered), func(m []testenv.Received) bool { return len(m) >= delivered })
		if code, body := in.api("POST", "/api/v1/pipelines/lagged/pause", "", nil); code != 200 {
			t.Fatalf("%s: pause: %d %s", in.name, code, body)
		}
		testenv.Eventually(t, 15*time.Second, in.name+": lagged paused", func() bool { st, _ := in.localStatus("lagged"); return st == "paused" })
		insert(2)
		t.Setenv("FERRY_URL", "http://"+in.addr)
		var out string
		testenv.Eventually(t, 30*time.Second, in.name+": ferry lag showing the 2 waiting rows", func() bool {
			code, o, errOut := run("lag")
			out = o + errOut
			return code == 0 && strings.Contains(o, "2 events")
		})
		return out, askDoctor(t, "lagged")
	}

	insert(3)
	files := startFileInstance(t, "files", dir)
	withoutStore, doc1 := lagWhilePaused(files, 3)
	files.kill()

	stored := startStoreInstance(t, "stored", e.DSN)
	if code, body := stored.api("POST", "/api/v1/pipelines", y, nil); code != 201 {
		t.Fatalf("create the store pipeline: %d %s", code, body)
	}
	withStore, doc2 := lagWhilePaused(stored, 5) // it resumes from the file pipeline's cursor: the 2 that waited
	t.Logf("without a store:\n%s\nwith one:\n%s", withoutStore, withStore)

	h1, row1 := lagRow(t, withoutStore, "lagged")
	h2, row2 := lagRow(t, withStore, "lagged")
	if !slices.Equal(h1, h2) {
		t.Errorf("columns differ:\n%v\n%v", h1, h2)
	}
	for _, col := range []string{"PIPELINE", "TENANT", "STATE", "BACKLOG"} {
		if row1[col] != row2[col] {
			t.Errorf("%s: %q without a store, %q with one", col, row1[col], row2[col])
		}
	}
	if row1["STATE"] != "paused" || row1["BACKLOG"] != "2 events" || row1["MEASURED"] == "-" || row2["MEASURED"] == "-" {
		t.Errorf("want paused with a backlog of 2 measured: %v / %v", row1, row2)
	}
	// The doctor, asked the same way, finds the same: paused, at the relay.
	want := doctorVerdict{Code: 1, Pipeline: "lagged", Stage: "relay", Backlog: "backlog 2 events"}
	if doc1 != want || doc2 != want {
		t.Errorf("ferry doctor: %+v without a store, %+v with one, want %+v", doc1, doc2, want)
	}
}

// doctorVerdict is what `ferry doctor --json` (no -c) says of one pipeline.
type doctorVerdict struct {
	Code            int
	Pipeline, Stage string
	Backlog         string // the backlog check's first evidence, up to the comma
}

// askDoctor runs `ferry doctor --json --pipeline name` against $FERRY_URL.
func askDoctor(t *testing.T, name string) doctorVerdict {
	t.Helper()
	code, out, errOut := run("doctor", "--json", "--pipeline", name)
	var rep struct {
		Pipelines []struct {
			Pipeline, Stage string
			Checks          []struct {
				Stage    string
				Evidence []string
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Pipelines) != 1 {
		t.Fatalf("ferry doctor: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	d := rep.Pipelines[0]
	v := doctorVerdict{Code: code, Pipeline: d.Pipeline, Stage: d.Stage}
	if len(d.Checks) > 0 && d.Checks[0].Stage == "backlog" && len(d.Checks[0].Evidence) > 0 {
		v.Backlog, _, _ = strings.Cut(d.Checks[0].Evidence[0], ",")
	}
	return v
}

// A backlog that cannot be measured reads FAILING with the reason, never
// its last value; a draining pipeline shows its delivery rate and ETA.
func TestLagShowsFailingBacklogAndETA(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"pipelines": [
			{"name": "revoked", "state": "backing_off", "since": "2026-01-01T00:00:00Z", "lag": {},
			 "health": {"backlog": 0, "backlog_unit": "events", "oldest_age_seconds": 0, "xmin_horizon_age_seconds": 0, "checked_at": "2026-01-01T00:00:00Z",
			  "measure_error": "ERROR: permission denied for table outbox (SQLSTATE 42501)", "measure_failing_since": "2026-01-01T00:01:00Z"}},
			{"name": "draining", "state": "running", "since": "2026-01-01T00:00:00Z", "lag": {},
			 "health": {"backlog": 20056, "backlog_unit": "events", "oldest_age_seconds": 40, "xmin_horizon_age_seconds": 0, "checked_at": "2026-01-01T00:00:00Z"},
			 "progress": {"delivered_per_second": 5012.4, "backlog_drain_per_second": 5000, "eta_seconds": 4.0112}}]}`))
	}))
	defer srv.Close()
	code, out, errOut := run("lag", "--url", srv.URL)
	if code != 0 {
		t.Fatalf("lag: exit %d: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	var revoked, draining string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "revoked "):
			revoked = l
		case strings.HasPrefix(l, "draining "):
			draining = l
		}
	}
	if !strings.Contains(revoked, "FAILING") || strings.Contains(revoked, "0 events") {
		t.Errorf("the unmeasurable backlog's row: %q", revoked)
	}
	if !strings.Contains(out, "backlog cannot be measured: ERROR: permission denied for table outbox (SQLSTATE 42501)") {
		t.Errorf("no reason for the failing measurement in:\n%s", out)
	}
	if !strings.Contains(draining, "5012/s") || !strings.Contains(draining, " 4s ") {
		t.Errorf("the draining row lacks its rate and ETA: %q", draining)
	}
}
