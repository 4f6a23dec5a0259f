package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A multi-line last_error is printed whole, its lines indented under the
// row, and the rows after it stay aligned with the header. lag finds the
// instance through $FERRY_URL, as pipelines and tokens do.
func TestLagWrapsMultiLineErrorsAndHonoursFerryURL(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pipelines" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"pipelines":[
			{"name":"a-long-pipeline-name","state":"failed","last_error":"connect: refused\nhint: check the DSN\n  detail: line 3","lag":{}},
			{"name":"b","state":"running","lag":{}}]}`))
	}))
	defer srv.Close()
	t.Setenv("FERRY_URL", srv.URL)
	t.Setenv("FERRY_TOKEN", "")
	var out, errb bytes.Buffer
	if code := Main([]string{"lag"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(out.String(), "\n")
	col := func(line, word string) int {
		for _, l := range lines {
			if strings.HasPrefix(l, line) {
				return strings.Index(l, word)
			}
		}
		t.Fatalf("no line %q in:\n%s", line, out.String())
		return -1
	}
	state := col("PIPELINE", "STATE")
	if a, b := col("a-long-pipeline-name", "failed"), col("b ", "running"); a != state || b != state {
		t.Errorf("STATE at %d, failed at %d, running at %d:\n%s", state, a, b, out.String())
	}
	for _, want := range []string{"\n  └ connect: refused\n    hint: check the DSN\n      detail: line 3\nb "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lag lacks %q:\n%s", want, out.String())
		}
	}
}
