package httpapi_test

import (
	"bytes"
	"context"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/store"
)

// The OpenAPI document describes every route of the real handler, with a
// store: each is registered under the pattern the document names, with
// the document's path parameters and request body, and what it answers to
// a real request is a documented response with the documented required
// fields. The document has no route the handler lacks.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	f := startControlWith(t, adminToken, false)
	ctx := context.Background()
	admin := store.Actor{TokenID: "test", Scope: store.ScopeAdmin}
	pipeline := f.pipelineYAML("a-pipe", "team-a")
	checkOpenAPI(t, f, pipeline, func() {
		_, sum, _ := store.Canonical([]byte(pipeline))
		if _, err := f.st.PutPipeline(ctx, admin, store.Write{Name: "a-pipe", Tenant: "team-a", Config: pipeline, Canonical: sum}); err != nil {
			t.Fatal(err)
		}
	})
}

// The same document describes the same routes without a store, where a
// file pipeline is the entry every pipeline route works on and the routes
// on what only a store keeps answer 409: every answer is documented.
func TestOpenAPIDescribesEveryRouteWithoutStore(t *testing.T) {
	f := startFiles(t, adminToken, xid8Harness, func(f *controlFixture) string {
		return "kind: tenant\nname: team-a\nlimits: {rate: 100}\n---\n" + f.pipelineYAML("a-pipe", "team-a")
	})
	testenv.Eventually(t, 20*time.Second, "a-pipe running", func() bool {
		st, err := f.sup.Status("a-pipe")
		return err == nil && st.State == engine.StateRunning
	})
	checkOpenAPI(t, f, f.pipelineYAML("a-pipe", "team-a"), func() {})
}

// checkOpenAPI checks the document against f's handler, route by route;
// reset puts back the pipeline a-pipe (of tenant team-a, pipeline's text)
// before each request.
func checkOpenAPI(t *testing.T, f *controlFixture, pipeline string, reset func()) {
	t.Helper()
	mux, ok := f.srv.Config.Handler.(*http.ServeMux)
	if !ok {
		t.Fatalf("the handler is a %T, not a ServeMux", f.srv.Config.Handler)
	}
	r := f.do(t, "GET", "/api/v1/openapi.json", adminToken, "", "")
	if r.code != 200 {
		t.Fatalf("openapi.json: %d %s", r.code, r.raw)
	}
	doc := r.body
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi: %v", doc["openapi"])
	}
	schemas := jsonschema.NewCompiler()
	schemas.DefaultDraft(jsonschema.Draft2020)
	whole, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := schemas.AddResource(openAPIURL, whole); err != nil {
		t.Fatal(err)
	}
	paths := doc["paths"].(map[string]any)
	components := doc["components"].(map[string]any)
	resolve := func(v any) map[string]any {
		m, _ := v.(map[string]any)
		for m != nil && m["$ref"] != nil {
			parts := strings.Split(strings.TrimPrefix(m["$ref"].(string), "#/components/"), "/")
			m = components[parts[0]].(map[string]any)[parts[1]].(map[string]any)
		}
		return m
	}
	var required func(schema map[string]any) []string
	required = func(schema map[string]any) []string {
		schema = resolve(schema)
		var out []string
		for _, r := range asSlice(schema["required"]) {
			out = append(out, r.(string))
		}
		for _, s := range asSlice(schema["allOf"]) {
			out = append(out, required(s.(map[string]any))...)
		}
		return out
	}

	bodies := map[string][2]string{
		"POST /api/v1/pipelines":                      {"application/yaml", f.pipelineYAML("b-pipe", "")},
		"PUT /api/v1/pipelines/{name}/config":         {"application/yaml", strings.ReplaceAll(pipeline, "20ms", "40ms")},
		"POST /api/v1/validate":                       {"application/yaml", pipeline},
		"PUT /api/v1/tenants/{name}":                  {"application/json", `{"limits":{"rate":5}}`},
		"POST /api/v1/tokens":                         {"application/json", `{"scope":"read"}`},
		"POST /api/v1/tokens/{id}/rotate":             {"application/json", `{"grace":"1m"}`},
		"PUT /api/v1/tenants/{name}/secrets/{secret}": {"application/json", `{"value":"v"}`},
		"PATCH /api/v1/pipelines/{name}/offsets":      {"application/json", `{"to":"latest"}`},
		"POST /api/v1/pipelines/{name}/backfill":      {"application/json", `{"aggregate_type":"order"}`},
	}
	routes := append([]string{"GET /metrics", "GET /healthz", "GET /readyz", "GET /ui/"}, httpapi.ControlRoutes()...)
	documented := map[string]bool{}
	for p, item := range paths {
		for m := range item.(map[string]any) {
			if m != "parameters" {
				documented[strings.ToUpper(m)+" "+p] = true
			}
		}
	}
	pathParam := regexp.MustCompile(`\{([a-z]+)\}`)
	for _, route := range routes {
		method, path, _ := strings.Cut(route, " ")
		if !documented[route] {
			t.Errorf("%s is served but not in the OpenAPI document", route)
			continue
		}
		delete(documented, route)
		item := paths[path].(map[string]any)
		op := item[strings.ToLower(method)].(map[string]any)

		// Path parameters: the pattern's and the document's are the same.
		var want, got []string
		for _, m := range pathParam.FindAllStringSubmatch(path, -1) {
			want = append(want, m[1])
		}
		for _, p := range append(asSlice(item["parameters"]), asSlice(op["parameters"])...) {
			if pm := resolve(p); pm["in"] == "path" {
				got = append(got, pm["name"].(string))
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			t.Errorf("%s: path parameters %v, documented %v", route, want, got)
		}
		// Authentication: /api/v1 needs the bearer token (the document's
		// default); the probes and metrics are open.
		sec, hasSec := op["security"]
		if open := !strings.HasPrefix(path, "/api/v1/"); open != (hasSec && len(asSlice(sec)) == 0) {
			t.Errorf("%s: security %v, but the route is open=%v", route, sec, open)
		}
		body, hasBody := bodies[route]
		if (op["requestBody"] != nil) != hasBody {
			t.Errorf("%s: request body documented %v, taken %v", route, op["requestBody"] != nil, hasBody)
		}

		// The real handler serves it under this pattern…
		reset()
		url := strings.NewReplacer("{name}", "a-pipe", "{id}", "tok_missing", "{secret}", "DB_URL").Replace(path)
		if strings.HasPrefix(path, "/api/v1/tenants/") {
			url = strings.NewReplacer("{name}", "team-a", "{secret}", "DB_URL").Replace(path)
		}
		req, _ := http.NewRequest(method, f.srv.URL+url, nil)
		if _, pattern := mux.Handler(req); pattern != route {
			t.Errorf("%s %s is served by pattern %q", method, url, pattern)
		}
		// …and answers as documented.
		resp := f.do(t, method, url, adminToken, body[0], body[1])
		responses := op["responses"].(map[string]any)
		documentedResp, ok := responses[strconv.Itoa(resp.code)]
		if !ok {
			t.Errorf("%s answered %d, not a documented response: %s", route, resp.code, resp.raw)
			continue
		}
		content, _ := resolve(documentedResp)["content"].(map[string]any)
		js, _ := content["application/json"].(map[string]any)
		if js == nil || resp.body == nil {
			continue
		}
		for _, field := range required(js["schema"].(map[string]any)) {
			if _, ok := resp.body[field]; !ok {
				t.Errorf("%s answered %d without required field %q: %s", route, resp.code, field, resp.raw)
			}
		}
		// And the whole answer is valid against the documented schema
		// (OpenAPI 3.1 schemas are JSON Schema 2020-12).
		pointer := "#/paths/" + escapePointer(path) + "/" + strings.ToLower(method) + "/responses/" + strconv.Itoa(resp.code)
		if ref, ok := documentedResp.(map[string]any)["$ref"].(string); ok {
			pointer = ref
		}
		pointer += "/content/application~1json/schema"
		sch, err := schemas.Compile(openAPIURL + pointer)
		if err != nil {
			t.Errorf("%s: the documented schema %s does not compile: %v", route, pointer, err)
			continue
		}
		answer, err := jsonschema.UnmarshalJSON(bytes.NewReader(resp.raw))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(answer); err != nil {
			t.Errorf("%s answered %d against its documented schema: %v\n%s", route, resp.code, err, resp.raw)
		}
	}
	for extra := range documented {
		t.Errorf("the OpenAPI document has %s, which the handler does not serve", extra)
	}
	t.Logf("%d routes checked against the document", len(routes))
}

// openAPIURL names the document for the schema compiler.
const openAPIURL = "https://ferry.invalid/openapi.json"

// escapePointer escapes a path for a JSON pointer (RFC 6901).
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
