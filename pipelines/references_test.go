package pipelines_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
)

func TestSecretReferences(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"none", "name: a\nsource: {type: poll, dsn: postgres://x}\n", ""},
		{"whole and inside", "source: {dsn: \"${DB_URL}\"}\nsink: {url: \"nats://u:${NATS_PW}@h:4222\"}\n", "DB_URL,NATS_PW"},
		{"a default, twice", "a: ${RATE:-5}\nb: [x, \"${RATE}\"]\n", "RATE"},
		{"an escaped dollar is no reference", "a: $${NOT_ONE}\n", ""},
		{"quoted escapes", "a: \"\\x24{HIDDEN}\"\n", "HIDDEN"},
		{"every document", "a: ${ONE}\n---\nb: ${TWO}\n", "ONE,TWO"},
		{"up to a document that does not parse", "a: ${ONE}\n---\nb: [\n", "ONE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(pipelines.SecretReferences([]byte(tc.yaml)), ","); got != tc.want {
				t.Fatalf("references %q, want %q", got, tc.want)
			}
		})
	}
}
