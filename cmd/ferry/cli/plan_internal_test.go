package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakePipelinesAPI answers as a ferry --store whose one API pipeline,
// "orders", has the stored config old; creating a pipeline is refused
// with 422, and updating one succeeds.
func fakePipelinesAPI(t *testing.T, old string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/pipelines", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"pipelines": []map[string]any{
			{"name": "orders", "managed_by": "api", "version": 3, "config_sha256": "stale"}}})
	})
	mux.HandleFunc("GET /api/v1/pipelines/orders/config", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(old))
	})
	mux.HandleFunc("POST /api/v1/pipelines", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(422)
		w.Write([]byte(`{"error":"sink.topic: must not be empty"}`))
	})
	mux.HandleFunc("PUT /api/v1/pipelines/orders/config", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"pipeline": map[string]any{"name": "orders", "version": 4}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func writePipelineDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const oldOrders = `name: orders
source:
  type: xid8
  dsn: postgres://ferry:hunter2@db:5432/app
sink:
  type: kafka
  topic: orders
  password: old-secret
  brokers: [k1:9092]
`

const newOrders = `name: orders
source:
  type: xid8
  dsn: postgres://ferry:swordfish@db:5432/app
sink:
  type: kafka
  topic: orders.v2
  password: new-secret
  brokers: [k1:9092, k2:9092]
`

// apply reports only what happened: a refused create is counted as
// failed, not as created, and the exit code is non-zero.
func TestApplySummaryCountsFailures(t *testing.T) {
	srv := fakePipelinesAPI(t, oldOrders)
	dir := writePipelineDir(t, map[string]string{"a.yaml": "name: payments\nsink: {type: kafka}\n", "b.yaml": newOrders})
	var out, errb bytes.Buffer
	code := Main([]string{"pipelines", "apply", "-f", dir, "--url", srv.URL}, &out, &errb)
	if code == 0 {
		t.Errorf("exit 0 although a create failed")
	}
	got := out.String()
	if !strings.Contains(got, "! create payments") || !strings.Contains(got, "FAILED: 422") {
		t.Errorf("the failed step is not marked:\n%s", got)
	}
	if !strings.Contains(got, "Applied: 0 created, 1 updated, 0 deleted, 0 unchanged; 1 failed.") {
		t.Errorf("summary does not say what happened:\n%s", got)
	}
}

// plan shows an update's changed fields with old and new values, secrets
// masked.
func TestPlanShowsFieldDiff(t *testing.T) {
	srv := fakePipelinesAPI(t, oldOrders)
	dir := writePipelineDir(t, map[string]string{"b.yaml": newOrders})
	var out, errb bytes.Buffer
	if code := Main([]string{"pipelines", "plan", "-f", dir, "--url", srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := out.String()
	for _, want := range []string{
		`~ update orders`,
		"\n    sink.topic: \"orders\" → \"orders.v2\"\n",
		"\n    sink.brokers[1]: (none) → \"k2:9092\"\n",
		`    sink.password: xxxxx → xxxxx (secret changed)`,
		`    source.dsn: "postgres://ferry:xxxxx@db:5432/app" → "postgres://ferry:xxxxx@db:5432/app" (secret changed)`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("plan lacks %q:\n%s", want, got)
		}
	}
	for _, secret := range []string{"hunter2", "swordfish", "old-secret", "new-secret"} {
		if strings.Contains(got, secret) {
			t.Errorf("plan shows the secret %q:\n%s", secret, got)
		}
	}
	// Only step lines start with a sign: scripts read those.
	for _, line := range strings.Split(got, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains("+~-=!", f[0]) && line != strings.TrimLeft(line, " ") {
			t.Errorf("a change line reads as a step: %q", line)
		}
	}
	if strings.Contains(got, "sink.type") || strings.Contains(got, "brokers[0]") {
		t.Errorf("plan lists unchanged fields:\n%s", got)
	}
	out.Reset()
	if code := Main([]string{"pipelines", "plan", "-f", dir, "--url", srv.URL, "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("-o json: exit %d", code)
	}
	if !strings.Contains(out.String(), `"path": "sink.topic"`) || strings.Contains(out.String(), "hunter2") {
		t.Errorf("-o json changes:\n%s", out.String())
	}
}
