package pipelines

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
)

func TestLiteralSecretName(t *testing.T) {
	for _, c := range []struct{ pipeline, path, want string }{
		{"orders-outbox", "source.dsn", "FERRY_ORDERS_OUTBOX_SOURCE_DSN"},
		{"orders", "sink.sasl.password", "FERRY_ORDERS_SINK_SASL_PASSWORD"},
		{"p1", "transforms[2].y", "FERRY_P1_TRANSFORMS_2__Y"},
		{"p", "sink.headers.x-é", "FERRY_P_SINK_HEADERS_X__"},
		{"p", strings.Repeat("a", 200), "FERRY_P_" + strings.Repeat("A", 128-len("FERRY_P_"))},
	} {
		if got := literalSecretName(c.pipeline, c.path); got != c.want {
			t.Errorf("%s %s: %s, want %s", c.pipeline, c.path, got, c.want)
		}
	}
	// A long name's suffix keeps it within the store's limit.
	r := rewrite{l: Loader{TenantSecrets: func(string, string) (string, bool) { return "", false }},
		pipeline: "p", used: map[string]bool{}, secrets: map[string]string{}}
	long := strings.Repeat("a", 200)
	first, second := r.name(long, "1"), r.name(long, "2")
	if len(first) != 128 || len(second) != 128 || !strings.HasSuffix(second, "A_2") || first == second {
		t.Errorf("long names %s (%d), %s (%d)", first, len(first), second, len(second))
	}
}

// Loader paths lead to their nodes: keys, items, and map keys that hold a
// dot or a bracket.
func TestNodeAt(t *testing.T) {
	var doc yaml.Node
	src := "source: {dsn: a}\ntransforms:\n  - {type: x}\n  - {type: y}\n  - {type: z, y: found, m: {a.b: dotted, 'c[0]': bracketed, a: {b: nested}}}\nsink: {brokers: [one, two]}\n"
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	root := doc.Content[0]
	for path, want := range map[string]string{
		"source.dsn": "a", "transforms[2].y": "found", "transforms[2].m.a.b": "dotted", "transforms[2].m.c[0]": "bracketed",
		"sink.brokers[1]": "two", "transforms[2].m.a": "", "transforms[3].y": "-", "transforms[x]": "-", "sink.topic": "-", "source.dsn.x": "-",
	} {
		n := nodeAt(root, path)
		switch {
		case want == "-" && n != nil:
			t.Errorf("%s: found %q, want nothing", path, n.Value)
		case want == "-":
		case n == nil:
			t.Errorf("%s: not found", path)
		case n.Value != want:
			t.Errorf("%s: %q, want %q", path, n.Value, want)
		}
	}
}

// literalSpans finds exactly what internal/redact masks: with each span
// replaced by a reference the value holds no literal (not too little),
// and masking the spans masks nothing redact would not (not too much).
func TestLiteralSpansAgreeWithRedact(t *testing.T) {
	for _, s := range []string{
		"postgres://u:hunter2@db/app",
		"postgres://u:@db/app",
		"postgres://u:p%40ss@db:5432/app?sslmode=disable",
		"postgres://u:first@db/app?password=second&sslmode=disable",
		"postgresql://u:a$$b@db/app",
		"amqp://guest:gu3st@rabbit:5672/vhost",
		"nats://t0ken@nats:4222",
		"tls://t0ken@nats:4222,nats://u:pw@other:4222",
		"wss://t0ken@nats",
		"nats://u:xxxxx@nats", // a literal that spells the mask
		"host=db user=u password=hunter2 dbname=app",
		"host=db sslpassword=k3y password='sec ret' dbname=app",
		`host=db password='p\'a ss' dbname=app`,
		"token=abc secret=def",
		"PASSWORD=upper",
		"postgres://u:pw@${HOST}/app",
		"postgres://${USER}:pw@db/app",
	} {
		spans, err := literalSpans(s)
		if err != nil || len(spans) == 0 {
			t.Errorf("%s: %v spans, err %v", s, spans, err)
			continue
		}
		referenced, masked := s, s
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			referenced = referenced[:sp.from] + "${X}" + referenced[sp.to:]
			masked = masked[:sp.from] + redact.Mask + masked[sp.to:]
		}
		if literalPassword(referenced) {
			t.Errorf("%s: with its spans %v referenced, %s still holds a literal", s, spans, referenced)
		}
		if !strings.Contains(s, "${") && redact.String(masked) != redact.String(s) {
			t.Errorf("%s: spans %v mask more than redact: %s vs %s", s, spans, redact.String(masked), redact.String(s))
		}
	}
	for _, s := range []string{"postgres://u:${PW}@db/app", "postgres://u@db/app", "nats://${T}@nats", "password=${PW} dbname=x", "plain"} {
		if spans, err := literalSpans(s); err != nil || len(spans) != 0 {
			t.Errorf("%s: spans %v, err %v; want none", s, spans, err)
		}
	}
	for _, s := range []string{"postgres://u:x${PW}@db", "postgres://u:${PW:-d}@db", "password=${A}${B}"} {
		if _, err := literalSpans(s); err != errMixedPassword {
			t.Errorf("%s: err %v, want the mixed-password error", s, err)
		}
	}
}
