package outbox

import (
	"maps"
	"testing"
)

// TestScanFlatHeaders makes sure the shapes rows carry are read in place
// (else every event would pay for encoding/json again), with the entries
// encoding/json reads.
func TestScanFlatHeaders(t *testing.T) {
	for _, raw := range []string{
		`{}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		`{"tenant": "acme", "content-type": "application/json", "attempt": 3, "retry": false, "ttl": null}`,
		`{"a":"1","b":-2.5e3}`, " {\n  \"ünï\": \"cödé ☃\"\n} ",
	} {
		got, ok := scanFlatHeaders(raw, nil)
		if !ok {
			t.Errorf("%s: not read in place", raw)
			continue
		}
		want, errText := decodeHeadersJSON(raw, nil)
		if errText != "" || !maps.Equal(asMap(got), asMap(want)) {
			t.Errorf("%s: read %q, encoding/json reads %q (%s)", raw, got, want, errText)
		}
	}
	for _, raw := range []string{`{"a":{}}`, `{"a":[]}`, `{"a":"\n"}`, `{"\u0061":"b"}`, "{\"a\":\"\xff\"}", `{"a":1,}`, `[]`} {
		if _, ok := scanFlatHeaders(raw, nil); ok {
			t.Errorf("%s: read in place, but is encoding/json's to read", raw)
		}
	}
}

func asMap(hs []header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.key] = h.value
	}
	return m
}
