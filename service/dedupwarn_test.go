package service_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/service"
)

// The service warns, on loading its pipelines, about two that read one
// outbox table into one NATS stream — once, not on every reload — and
// runs them all the same: a warning, not a refusal.
func TestServiceWarnsPipelinesSharingAStream(t *testing.T) {
	doc := func(name, subject string) string {
		return "name: " + name + "\nsource: {type: xid8, dsn: \"postgres://ferry@127.0.0.1:1/shop\", table: outbox}\n" +
			"sink: {type: nats, url: \"nats://127.0.0.1:1\", subject: " + subject + "}\n"
	}
	specs, err := pipelines.Loader{}.LoadBytes("shared.yaml", []byte(doc("orders-a", "orders.a")+"---\n"+doc("orders-b", "orders.b")+"---\n"+doc("billing", "billing.events")))
	if err != nil {
		t.Fatal(err)
	}
	sup, err := engine.NewSupervisor(engine.Options{Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	conv := &service.Converger{Supervisor: sup, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		LoadFiles: func() ([]*pipelines.Spec, error) { return specs, nil }}
	if err := conv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := conv.ReloadFiles(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "pipelines share a broker's deduplication"); n != 1 {
		t.Fatalf("%d warnings after a start and a reload, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"level=WARN", "shared.yaml:1: pipelines orders-a, orders-b read the same outbox table outbox", "subjects orders.>"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "billing") {
		t.Errorf("warns about a pipeline that shares nothing:\n%s", logs.String())
	}
	if n := len(sup.Statuses()); n != 3 {
		t.Errorf("%d pipelines known, want all 3", n)
	}
}
