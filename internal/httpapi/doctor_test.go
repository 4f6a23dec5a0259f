package httpapi_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

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
	testenv.Eventually(t, 10*time.Second, "sick running", func() bool {
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
