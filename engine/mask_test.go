package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/xid8"
)

// syncBuffer is a log destination the supervisor's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A pipeline whose source cannot connect shows the error — which names the
// database, filled in by a secret — as its last error and in its logs, with
// the secret masked: nowhere the value itself.
func TestSupervisorMasksSecretsInStatusAndLogs(t *testing.T) {
	const secret = "sekrit_token_value"
	r := plugins.NewRegistry()
	xid8.Register(r)
	sink := &captureSink{failed: map[string]bool{}}
	plugins.RegisterSink(r, "capture", func() *noCfg { return &noCfg{} }, func(*noCfg, plugins.Env) (plugins.Sink, error) { return sink, nil })
	doc := "name: masked\ntenant: team-a\nsource: {type: xid8, dsn: 'postgres://u@127.0.0.1:1/${DB}', poll_interval: 20ms}\nsink: {type: capture}\n"
	for _, mode := range []string{"file", "control plane"} {
		t.Run(mode, func(t *testing.T) {
			l := pipelines.Loader{Registry: r, LookupEnv: func(k string) (string, bool) { v, ok := map[string]string{"DB": secret}[k]; return v, ok }}
			if mode == "control plane" {
				l.LookupEnv = func(string) (string, bool) { return "", false }
				l.TenantSecrets = func(tenant, k string) (string, bool) {
					return map[string]string{"team-a/DB": secret}[tenant+"/"+k], tenant == "team-a" && k == "DB"
				}
			}
			specs, err := l.LoadBytes("masked.yaml", []byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			sup, err := engine.NewSupervisor(engine.Options{DrainTimeout: 2 * time.Second,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sup.Run(ctx, specs) }()
			var st engine.Status
			testenv.Eventually(t, 20*time.Second, "the pipeline failing to connect", func() bool {
				st, _ = sup.Status("masked")
				// The supervisor's line and the source's own, through the
				// pipeline's logger.
				return st.State == engine.StateBackingOff && st.LastError != "" &&
					strings.Contains(logs.String(), "pipeline failing; retrying") &&
					strings.Contains(logs.String(), "source cannot start; retrying")
			})
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Fatal(err)
			}
			// The error quotes the database: masked, it names the reference.
			if !strings.Contains(st.LastError, "${DB}") {
				t.Errorf("last error %q does not show the masked database", st.LastError)
			}
			for where, text := range map[string]string{"last error": st.LastError, "log": logs.String()} {
				if strings.Contains(text, secret) {
					t.Errorf("the secret in the %s:\n%s", where, text)
				}
			}
			for _, r := range sup.Readiness() {
				if strings.Contains(r.Message, secret) {
					t.Errorf("the secret in readiness: %s", r.Message)
				}
			}
		})
	}
}
