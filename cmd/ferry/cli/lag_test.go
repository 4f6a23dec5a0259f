package cli_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// ferry lag and doctor take --url as --http takes its address: a URL,
// host:port, :port or a bare port. lag shows the owner of a standby
// pipeline, the age of each backlog measurement, the next retry, and a
// degraded coordination database above the table.
func TestLagURLForms(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"pipelines": [
			{"name": "orders", "state": "standby", "owner": "ferry-b", "since": "2026-01-01T00:00:00Z", "lag": {}},
			{"name": "billing", "state": "backing_off", "last_error": "read outbox: dial tcp 127.0.0.1:1: connect: connection refused",
			 "next_retry": "2999-01-01T00:00:00Z", "since": "2026-01-01T00:00:00Z", "lag": {},
			 "health": {"backlog": 7, "backlog_unit": "events", "oldest_age_seconds": 12.5, "xmin_horizon_age_seconds": 0, "checked_at": "2026-01-01T00:00:00Z"}}],
			"coordination": {"up": false, "database": "postgres://ferry:xxxxx@db:5432/coord", "instance": "ferry-a",
			 "last_error": "dial tcp 10.0.0.9:5432: connect: connection refused", "since": "2026-01-01T00:00:00Z", "degraded": "keeps what it owns"}}`))
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
		for _, want := range []string{"HA DEGRADED", "dial tcp 10.0.0.9:5432", "standby (on ferry-b)", "7 events", "12.5s", "ago", "(next retry in"} {
			if !strings.Contains(out, want) {
				t.Errorf("lag --url %s: no %q in:\n%s", u, want, out)
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
