package cli

import (
	"strings"
	"testing"
)

// The pipelines and tokens commands take --url in every form lag and
// doctor take.
func TestAPIClientURLForms(t *testing.T) {
	for in, want := range map[string]string{
		"http://ferry:9090/": "http://ferry:9090/api/v1",
		"127.0.0.1:19375":    "http://127.0.0.1:19375/api/v1",
		":19375":             "http://127.0.0.1:19375/api/v1",
		"19375":              "http://127.0.0.1:19375/api/v1",
	} {
		c, err := (&apiFlags{url: in, output: "table"}).client()
		if err != nil {
			t.Fatal(err)
		}
		if c.base != want {
			t.Errorf("--url %s: base %s, want %s", in, c.base, want)
		}
	}
}

// A 401 says how to give the token; a detail repeating the message is not
// printed twice.
func TestAPIErrorText(t *testing.T) {
	e := &apiError{Status: 401, Message: "missing bearer token"}
	if got := e.Error(); !strings.Contains(got, "--token-file") || !strings.Contains(got, "$FERRY_TOKEN") {
		t.Errorf("401: %q", got)
	}
	e = &apiError{Status: 422, Message: "position.xact_id: abc is not a transaction id"}
	e.Details = append(e.Details, struct {
		Path    string `json:"path"`
		Line    int    `json:"line"`
		Message string `json:"message"`
	}{Path: "position.xact_id", Message: "abc is not a transaction id"})
	if got := e.Error(); strings.Count(got, "abc is not a transaction id") != 1 {
		t.Errorf("422 repeats its detail: %q", got)
	}
}
