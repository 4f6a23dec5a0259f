package cli_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// `ferry doctor NAME` asks the running ferry at --url to walk that one
// pipeline, wherever it is defined (a store pipeline has no file here):
// a positional argument that is no file's path is a pipeline's name.
func TestDoctorPositionalName(t *testing.T) {
	var mu sync.Mutex
	var walked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/pipelines":
			_, _ = w.Write([]byte(`{"pipelines": [{"name": "orders", "state": "running"}, {"name": "billing", "tenant": "team-a", "state": "running"}]}`))
		case "/api/v1/pipelines/billing/doctor", "/api/v1/pipelines/orders/doctor":
			name := strings.Split(r.URL.Path, "/")[4]
			mu.Lock()
			walked = append(walked, name)
			mu.Unlock()
			_, _ = w.Write([]byte(`{"pipeline": "` + name + `", "healthy": true, "checks": [{"stage": "backlog", "status": "ok", "evidence": ["backlog 0 events"]}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	t.Setenv("FERRY_URL", "")
	t.Setenv("FERRY_TOKEN", "")

	code, out, errOut := run("doctor", "--url", srv.URL, "billing")
	if code != 0 || !strings.Contains(out, "billing: healthy") || strings.Contains(out, "orders") {
		t.Fatalf("doctor billing: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if len(walked) != 1 || walked[0] != "billing" {
		t.Fatalf("walked %v, want billing only", walked)
	}
	// A name the instance does not know is said to be unknown there, not
	// a missing file.
	code, _, errOut = run("doctor", "--url", srv.URL, "nosuch")
	if code != 2 || !strings.Contains(errOut, `no pipeline "nosuch"`) {
		t.Fatalf("doctor nosuch: exit %d: %s", code, errOut)
	}
}
