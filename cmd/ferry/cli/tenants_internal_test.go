package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// tenants create writes the record of a tenant that has none, with
// If-None-Match: *, and refuses one that has; tenants delete deletes and
// says what went with the tenant.
func TestTenantsCreateAndDelete(t *testing.T) {
	var mu sync.Mutex
	puts := map[string]string{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "existing" {
			w.WriteHeader(404)
			w.Write([]byte(`{"error":"no such tenant"}`))
			return
		}
		w.Write([]byte(`{"name":"existing","version":2,"limits":{"rate":1}}`))
	})
	mux.HandleFunc("DELETE /api/v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"deleted":"acme","tokens_revoked":["t1","t2"],"secrets_deleted":3}`))
	})
	mux.HandleFunc("PUT /api/v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") != "*" {
			w.WriteHeader(400)
			w.Write([]byte(`{"error":"create without If-None-Match"}`))
			return
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		puts[r.PathValue("name")] = string(body)
		mu.Unlock()
		var rec map[string]any
		_ = json.Unmarshal(body, &rec)
		rec["name"], rec["version"] = r.PathValue("name"), 1
		_ = json.NewEncoder(w).Encode(rec)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	put := func(name string) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		b, ok := puts[name]
		return b, ok
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(append(args, "--url", srv.URL), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := run("tenants", "create", "acme", "--rate", "5", "--allow-broker", "k1:9092")
	if code != 0 || !strings.Contains(out, "acme") {
		t.Fatalf("create acme: exit %d\n%s%s", code, out, errs)
	}
	if body, _ := put("acme"); !strings.Contains(body, `"rate":5`) || !strings.Contains(body, `"brokers":["k1:9092"]`) {
		t.Errorf("create acme sent %s", body)
	}
	code, _, errs = run("tenants", "create", "existing", "--rate", "5")
	if code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("create existing: exit %d: %s", code, errs)
	}
	if body, ok := put("existing"); ok {
		t.Errorf("create overwrote an existing tenant: %s", body)
	}
	code, out, errs = run("tenants", "delete", "acme")
	if code != 0 || !strings.Contains(out, "tenant acme deleted: 2 token(s) revoked, 3 secret(s) deleted") {
		t.Errorf("delete: exit %d: %s%s", code, out, errs)
	}
}
