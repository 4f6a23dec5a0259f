package httpapi

import (
	"context"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"

	_ "github.com/ferryhq/ferry/sinks/nats"
	_ "github.com/ferryhq/ferry/sources/xid8"
)

// urlWithPassword is hunter2 as the password of a URL, as redact knows one.
var urlWithPassword = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^/:@\s]*:hunter2@`)

// FuzzDecode feeds arbitrary bodies through the API's pipeline decode
// path (Content-Type, JSON/YAML, name and tenant filling, the loader):
// never a panic, every refusal a 4xx with a message, nothing accepted that
// does not load again, and a password never echoed.
func FuzzDecode(f *testing.F) {
	good := "name: orders\nsource: {type: xid8, dsn: 'postgres://u:hunter2@db/app'}\nsink: {type: nats, url: 'nats://h:4222', subject: s}\n"
	f.Add(good, 0, false)
	f.Add(good, 1, true)
	f.Add(`{"name":"orders","source":{"type":"xid8","dsn":"postgres://u:hunter2@db/app"},"sink":{"type":"nats","subject":"s"}}`, 1, false)
	f.Add(`{"name":"orders",`, 1, false)
	f.Add("name: orders\ntenant: team-b\nsource: {type: xid8, dsn: x, batch_size: lots}\nsink: {type: natz}\n", 0, true)
	f.Add("- a\n- b\n", 0, false)
	f.Add(good+"---\n"+good, 0, false)
	f.Add("&a [*a]", 0, false)
	c := &api{o: Options{Control: &Control{Converger: emptyConverger{}}}}
	types := []string{"application/yaml", "application/json", "", "text/plain"}
	f.Fuzz(func(t *testing.T, body string, ct int, tenantScope bool) {
		req := httptest.NewRequest("PUT", "/api/v1/pipelines/orders/config", strings.NewReader(body))
		if ct = ct & 3; types[ct] != "" {
			req.Header.Set("Content-Type", types[ct])
		}
		scope := store.ScopeAdmin
		if tenantScope {
			scope = "tenant:team-a"
		}
		text, prob := readPipelineBody(httptest.NewRecorder(), req)
		if prob == nil {
			var spec *pipelines.Spec
			text, spec, prob = c.preparePipeline(text, "orders", scope)
			if prob == nil {
				if spec == nil {
					t.Fatal("accepted without a spec")
				}
				if _, err := c.o.Control.loader().LoadBytes("again", text); err != nil {
					t.Fatalf("accepted text does not load again: %v\n%s", err, text)
				}
				return
			}
		}
		if prob.code < 400 || prob.code >= 500 || prob.msg == "" {
			t.Fatalf("refusal %d %q", prob.code, prob.msg)
		}
		rec := httptest.NewRecorder()
		writeProblem(rec, prob)
		if rec.Code != prob.code || !strings.Contains(rec.Header().Get("Content-Type"), "json") {
			t.Fatalf("written as %d %s", rec.Code, rec.Header().Get("Content-Type"))
		}
		// hunter2 as a URL's password must not come back; elsewhere in the
		// body (a type name) it is no secret.
		if strings.Contains(rec.Body.String(), "hunter2") && !strings.Contains(urlWithPassword.ReplaceAllString(body, ""), "hunter2") {
			t.Fatalf("password in the answer: %s", rec.Body.String())
		}
	})
}

// emptyConverger is a converger that has read an empty store: no tenant,
// no secret, no policy (what a zero service.Converger answers).
type emptyConverger struct{}

func (emptyConverger) Snapshot() store.Snapshot { return store.Snapshot{} }
func (emptyConverger) Changed()                 {}
func (emptyConverger) Converge(context.Context) (engine.ReloadResult, error) {
	return engine.ReloadResult{}, nil
}
func (emptyConverger) CheckPolicy(_ context.Context, spec *pipelines.Spec, _ time.Time) []*pipelines.Error {
	if spec.Tenant == "" {
		return nil
	}
	return policy.Check(spec, policy.Policy{}, policy.CheckEnv{})
}
func (emptyConverger) TenantPolicy(string) policy.Policy { return policy.Policy{} }
func (emptyConverger) RequestLoader() pipelines.Loader {
	return pipelines.Loader{
		TenantSecrets: func(string, string) (string, bool) { return "", false },
		AllowFiles:    func(string) bool { return false },
	}
}
