package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// TestOTLPFromEnvironment: with no provider set, spans go over OTLP/HTTP
// to the endpoint OTEL_EXPORTER_OTLP_ENDPOINT names, with the headers
// OTEL_EXPORTER_OTLP_HEADERS adds and the service name
// OTEL_SERVICE_NAME sets; Shutdown flushes them.
func TestOTLPFromEnvironment(t *testing.T) {
	var mu sync.Mutex
	var got []*coltrace.ExportTraceServiceRequest
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &coltrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got, auth = append(got, req), r.Header.Get("Authorization")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20t0ken")
	t.Setenv("OTEL_SERVICE_NAME", "ferry-test")
	tracing.SetProvider(nil)
	t.Cleanup(func() { tracing.SetProvider(nil) })

	p, err := tracing.New(tracing.Config{Enabled: true}, "kafka", nil, plugins.Env{Pipeline: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage("0f8fad5b-d9cb-469f-a165-70867728950e", []byte(`{}`))
	p.Start(m, "orders").End(nil)
	if err := tracing.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 {
		t.Fatal("the collector received nothing")
	}
	if auth != "Bearer t0ken" {
		t.Errorf("Authorization %q, want the header OTEL_EXPORTER_OTLP_HEADERS set", auth)
	}
	rs := got[0].ResourceSpans[0]
	service := ""
	for _, kv := range rs.Resource.Attributes {
		if kv.Key == "service.name" {
			service = kv.Value.GetStringValue()
		}
	}
	span := rs.ScopeSpans[0].Spans[0]
	if service != "ferry-test" || span.Name != "send orders" {
		t.Errorf("service %q span %q, want ferry-test and \"send orders\"", service, span.Name)
	}
}

// An unknown OTLP protocol is an error naming the variable, not a silent
// fallback.
func TestOTLPUnknownProtocol(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	tracing.SetProvider(nil)
	t.Cleanup(func() { tracing.SetProvider(nil) })
	_, err := tracing.New(tracing.Config{Enabled: true}, "kafka", nil, plugins.Env{})
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("error %v, want one naming OTEL_EXPORTER_OTLP_PROTOCOL", err)
	}
}
