package pipelines_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Masks are the values references filled in — from the environment or a
// tenant's secrets, not a default written in the document — of at least 4
// characters, once each, longest first; Mask shows each as its reference.
func TestMasks(t *testing.T) {
	doc := `name: orders
source:
  type: xid8
  dsn: postgres://${DB_USER}:${DB_PW}@db/${DB_NAME}
  table: ${TABLE:-public.outbox}
  batch_size: ${BATCH}
sink:
  type: nats
  url: nats://${DB_PW}@nats:4222
  subject: ${SUBJECT}
`
	env := map[string]string{"DB_USER": "ferry", "DB_PW": "hunter2-long", "DB_NAME": "app", "BATCH": "100", "SUBJECT": "orders.events"}
	for _, mode := range []string{"file", "control plane"} {
		l := loader(env)
		if mode == "control plane" {
			l.TenantSecrets = func(string, string) (string, bool) { return "", false }
		}
		specs, err := l.LoadBytes("orders.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		s := specs[0]
		// DB_NAME "app" and BATCH "100" are too short; public.outbox is the
		// document's own default; hunter2-long is there once.
		if want := []string{"orders.events", "hunter2-long", "ferry"}; !slices.Equal(s.Masks, want) {
			t.Errorf("%s: masks %q, want %q", mode, s.Masks, want)
		}
		got := s.Mask(`dial postgres://ferry:hunter2-long@db/app: "hunter2-long" refused; subject orders.events`)
		if want := `dial postgres://${DB_USER}:${DB_PW}@db/app: "${DB_PW}" refused; subject ${SUBJECT}`; got != want {
			t.Errorf("%s: masked\n%s\nwant\n%s", mode, got, want)
		}
	}

	// Masks set by hand, and their escaped forms in errors.
	s := &pipelines.Spec{Masks: []string{"p@ss word\"x"}}
	for in, want := range map[string]string{
		`pw p@ss word"x`:        "pw [secret]",
		`quoted "p@ss word\"x"`: `quoted "[secret]"`,
		"url p@ss%20word%22x":   "url [secret]",
		"query p%40ss+word%22x": "query [secret]",
		"nothing here":          "nothing here",
	} {
		if got := s.Mask(in); got != want {
			t.Errorf("Mask(%q) = %q, want %q", in, got, want)
		}
	}
	if got := (*pipelines.Spec)(nil).Mask("x"); got != "x" {
		t.Errorf("nil spec: %q", got)
	}
}

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
			sup, err := pipelines.NewSupervisor(pipelines.Options{DrainTimeout: 2 * time.Second,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sup.Run(ctx, specs) }()
			var st pipelines.Status
			testenv.Eventually(t, 20*time.Second, "the pipeline failing to connect", func() bool {
				st, _ = sup.Status("masked")
				// The supervisor's line and the source's own, through the
				// pipeline's logger.
				return st.State == pipelines.StateBackingOff && st.LastError != "" &&
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
