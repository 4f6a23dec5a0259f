package doctor_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/doctor"
)

// Asked through a running Ferry whose store is unreachable, the doctor
// says so above the pipelines — they run as last read and no change can
// be made — and exits 1; with the store up it says nothing of it.
func TestDoctorStoreDown(t *testing.T) {
	body := `{"pipelines": [], "store": {"up": false, "since": "2026-01-01T00:00:05Z", "read_at": "2026-01-01T00:00:04Z",
		"last_error": "dial tcp 10.0.0.8:5432: connect: connection refused"}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(body)) }))
	defer srv.Close()
	rep := doctor.Run(context.Background(), nil, doctor.Options{URL: srv.URL})
	if rep.Store == nil || rep.Store.Status != doctor.Unhealthy || rep.ExitCode() != 1 {
		t.Fatalf("store check %+v, exit %d", rep.Store, rep.ExitCode())
	}
	var out bytes.Buffer
	rep.Print(&out)
	for _, want := range []string{"instance: store unhealthy", "unreachable since 2026-01-01T00:00:05Z: dial tcp 10.0.0.8:5432",
		"run as last read (at 2026-01-01T00:00:04Z)", "→ make the store's database reachable"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, out.String())
		}
	}
	body = `{"pipelines": [], "store": {"up": true}}`
	rep = doctor.Run(context.Background(), nil, doctor.Options{URL: srv.URL})
	out.Reset()
	rep.Print(&out)
	if rep.ExitCode() != 0 || strings.Contains(out.String(), "store") {
		t.Fatalf("store up: exit %d\n%s", rep.ExitCode(), out.String())
	}
}
