package pipelines_test

import (
	"slices"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
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
