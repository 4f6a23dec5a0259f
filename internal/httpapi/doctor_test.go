package httpapi_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
)

// The doctor of a store pipeline, asked while the store is unreachable,
// says so with 503: a read changes nothing, so "nothing was changed" is
// no answer; once the store is back, it walks the pipeline again.
func TestDoctorDuringStoreOutage(t *testing.T) {
	var proxy *faultproxy.Proxy
	f := startControlVia(t, adminToken, true, func(dsn string) string {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		proxy = faultproxy.Start(t, u.Host)
		u.Host = proxy.Addr()
		return u.String()
	})
	if r := f.do(t, "PUT", "/api/v1/pipelines/sick/config", adminToken, "application/yaml", f.pipelineYAML("sick", "team-a")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "sick running", func() bool {
		st, err := f.sup.Status("sick")
		return err == nil && st.State == engine.StateRunning
	})

	proxy.Cut()
	r := f.do(t, "GET", "/api/v1/pipelines/sick/doctor", adminToken, "", "")
	msg, _ := r.body["error"].(string)
	if r.code != 503 || !strings.Contains(msg, "the store is unreachable") || strings.Contains(msg, "nothing was changed") {
		t.Fatalf("doctor with the store down: %d %s, want 503 naming the store unreachable", r.code, r.raw)
	}

	proxy.Heal()
	testenv.Eventually(t, 20*time.Second, "the doctor walking sick again", func() bool {
		r = f.do(t, "GET", "/api/v1/pipelines/sick/doctor", adminToken, "", "")
		return r.code == 200 && r.body["pipeline"] == "sick"
	})
}

// The doctor the API walks runs inside the instance: it judges the relay
// by the pipeline's state there, not by the sessions on the source
// database — where the instance's own pool (which measures a paused
// pipeline's backlog, and serves its other pipelines) passes for a relay
// running it. A paused pipeline stops the walk at the relay, naming the
// resume.
func TestDoctorOfAPausedPipelineInsideTheInstance(t *testing.T) {
	f := startControl(t, adminToken)
	if r := f.do(t, "PUT", "/api/v1/pipelines/idle/config", adminToken, "application/yaml", f.pipelineYAML("idle", "team-a")); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "idle running", func() bool {
		st, err := f.sup.Status("idle")
		return err == nil && st.State == engine.StateRunning
	})
	if r := f.do(t, "POST", "/api/v1/pipelines/idle/pause", adminToken, "", ""); r.code/100 != 2 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	testenv.Eventually(t, 60*time.Second, "idle paused", func() bool {
		st, err := f.sup.Status("idle")
		return err == nil && st.State == engine.StatePaused
	})
	// A pool session on the database, as an instance running other
	// pipelines there keeps.
	cfg, err := pgx.ParseConfig(f.e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "ferry:pool"
	pool, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close(context.Background())

	r := f.do(t, "GET", "/api/v1/pipelines/idle/doctor", adminToken, "", "")
	if r.code != 200 || r.body["stage"] != "relay" || r.body["healthy"] != false {
		t.Fatalf("doctor of a paused pipeline: %d %s; want the walk stopping at the relay", r.code, r.raw)
	}
	if !strings.Contains(string(r.raw), "state paused") || !strings.Contains(string(r.raw), "/api/v1/pipelines/idle/resume") {
		t.Errorf("doctor of a paused pipeline: %s; want its state and the resume", r.raw)
	}
}
