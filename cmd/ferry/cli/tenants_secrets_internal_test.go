package cli

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// tenants set sends the secret quotas its flags name, and keeps those
// the tenant has when they are not named.
func TestTenantsSetSecretQuotas(t *testing.T) {
	var mu sync.Mutex
	var sent []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"3"`)
		w.Write([]byte(`{"name":"team-b","version":3,"limits":{"rate":1,"max_secrets":40,"max_secret_bytes":5000}}`))
	})
	mux.HandleFunc("PUT /api/v1/tenants/{name}", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		sent = append(sent, string(body))
		mu.Unlock()
		w.Write([]byte(`{"name":"team-b","version":4}`))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--max-secrets", "500", "--max-secret-bytes", "2000000"}, []string{`"max_secrets":500`, `"max_secret_bytes":2000000`, `"rate":1`}},
		{[]string{"--rate", "9"}, []string{`"max_secrets":40`, `"max_secret_bytes":5000`, `"rate":9`}},
	} {
		var out, errb bytes.Buffer
		if code := Main(append([]string{"tenants", "set", "team-b", "--url", srv.URL}, tc.args...), &out, &errb); code != 0 {
			t.Fatalf("tenants set %v: exit %d\n%s%s", tc.args, code, out.String(), errb.String())
		}
		mu.Lock()
		body := sent[len(sent)-1]
		mu.Unlock()
		for _, w := range tc.want {
			if !strings.Contains(body, w) {
				t.Errorf("tenants set %v sent %s, without %s", tc.args, body, w)
			}
		}
	}
}
