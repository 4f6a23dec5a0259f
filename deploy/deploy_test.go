// Package deploy_test checks the operations files: the Grafana dashboard and
// the Prometheus alert rules parse, and every metric they reference is one
// Ferry exports — checked against a live scrape of pipelines with every
// source, a canary and traffic.
//
// It is a test only: it may import product packages and the test harnesses,
// and nothing imports it.
package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
	_ "github.com/ferryhq/ferry/transforms/headers"
	_ "github.com/ferryhq/ferry/transforms/router"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var metricName = regexp.MustCompile(`\bferry_[a-z0-9_]+`)

func referenced(exprs []string) []string {
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			seen[m] = true
		}
	}
	var out []string
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func dashboardExprs(t *testing.T) []string {
	b, err := os.ReadFile("grafana/ferry.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/ferry.json: %v", err)
	}
	var exprs []string
	rows := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			rows++
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	if rows < 4 || len(exprs) < 15 {
		t.Fatalf("dashboard has %d rows and %d queries", rows, len(exprs))
	}
	return exprs
}

func alertExprs(t *testing.T) []string {
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr string
				For         string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	var exprs, names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v lacks alert, expr or summary", r)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			exprs, names = append(exprs, r.Expr), append(names, r.Alert)
		}
	}
	for _, want := range []string{"FerryOldestUndeliveredOverBudget", "FerryBacklogGrowing", "FerryCanaryMissing",
		"FerryWalRetainedGrowing", "FerrySlotInactive", "FerryXminHorizonOld", "FerryPipelineFailed"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
	return exprs
}

// TestEveryReferencedMetricIsExported runs an xid8 pipeline with a canary,
// a poll and a wal pipeline, with traffic, and scrapes them.
func TestEveryReferencedMetricIsExported(t *testing.T) {
	exprs := append(dashboardExprs(t), alertExprs(t)...)

	x := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	p := relaytest.Setup(t, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema})
	w := relaytest.Setup(t, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	walName := strings.ToLower(testenv.Name("ops_wal"))
	y := fmt.Sprintf(`name: ops-xid8
source: {type: xid8, dsn: %q, poll_interval: 20ms, metrics_interval: 1s}
transforms:
  - {type: canary, topic: %s.canary, generate: {interval: 200ms}}
sink: {type: nats, url: %q, subject: %s}
---
name: ops-poll
source: {type: poll, dsn: %q, poll_interval: 20ms, metrics_interval: 1s}
sink: {type: nats, url: %q, subject: %s}
---
name: %s
source: {type: wal, dsn: %q}
sink: {type: nats, url: %q, subject: %s}
`, x.DSN, x.Subject, x.NATS, x.Subject, p.DSN, p.NATS, p.Subject, walName, w.DSN, w.NATS, w.Subject)
	specs, err := pipelines.Loader{}.LoadBytes("ops.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sup, err := engine.NewSupervisor(engine.Options{Metrics: reg, DrainTimeout: 2 * time.Second,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Ownership: &engine.Ownership{Instance: "ops", CoordinationDSN: x.DSN, Interval: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	t.Cleanup(func() { cancel(); <-done })

	for _, e := range []*relaytest.Env{x, p, w} {
		if _, err := plugintest.Insert(ctx, e.Pool, "agg-1"); err != nil {
			t.Fatal(err)
		}
	}
	exported := serviceMetrics(t)
	refs := referenced(exprs)
	// Some appear only after a slow timer's first tick or a canary's round
	// trip: scrape until all are there or the deadline passes.
	var missing []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			exported[mf.GetName()] = true
		}
		missing = missing[:0]
		for _, r := range refs {
			if !exported[r] {
				missing = append(missing, r)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(missing) > 0 {
		t.Fatalf("referenced but not exported: %v", missing)
	}
	t.Logf("%d metrics referenced by the dashboard and alerts, all exported", len(refs))
}

// The Kubernetes manifests parse, the Deployment runs two replicas with
// both probes, and the pipelines in the ConfigMap load.
func TestKubernetesManifests(t *testing.T) {
	kinds := map[string]map[string]any{}
	for _, f := range []string{"configmap.yaml", "secret.yaml", "deployment.yaml", "service.yaml"} {
		b, err := os.ReadFile("kubernetes/" + f)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		kinds[doc["kind"].(string)] = doc
	}
	dep := kinds["Deployment"]["spec"].(map[string]any)
	if dep["replicas"] != 2 {
		t.Errorf("replicas %v, want 2", dep["replicas"])
	}
	c := dep["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if c["livenessProbe"].(map[string]any)["httpGet"].(map[string]any)["path"] != "/healthz" ||
		c["readinessProbe"].(map[string]any)["httpGet"].(map[string]any)["path"] != "/readyz" {
		t.Errorf("probes: %v %v", c["livenessProbe"], c["readinessProbe"])
	}
	// The store DSN comes from the Secret, not from args.
	var storeFromSecret bool
	for _, e := range c["env"].([]any) {
		m := e.(map[string]any)
		if m["name"] == "FERRY_STORE_DSN" {
			ref, _ := m["valueFrom"].(map[string]any)["secretKeyRef"].(map[string]any)
			_, inSecret := kinds["Secret"]["stringData"].(map[string]any)["FERRY_STORE_DSN"]
			storeFromSecret = ref["name"] == "ferry" && ref["key"] == "FERRY_STORE_DSN" && inSecret
		}
	}
	if !storeFromSecret {
		t.Error("the Deployment does not take FERRY_STORE_DSN from the Secret")
	}
	for _, a := range c["args"].([]any) {
		if strings.Contains(fmt.Sprint(a), "postgres://") {
			t.Errorf("a DSN in the container's args: %v", a)
		}
	}
	env := map[string]string{"ORDERS_DB_URL": "postgres://ferry@db/orders", "NATS_URL": "nats://nats:4222"}
	var all strings.Builder
	for _, v := range kinds["ConfigMap"]["data"].(map[string]any) {
		all.WriteString("---\n" + v.(string))
	}
	specs, err := pipelines.Loader{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}.LoadBytes("configmap", []byte(all.String()))
	if err != nil {
		t.Fatalf("the ConfigMap's pipelines do not load: %v", err)
	}
	if len(specs) != 1 || specs[0].TenantLimits == nil || specs[0].TenantLimits.Rate != 5000 {
		t.Fatalf("specs %+v", specs)
	}
}

// serviceMetrics are the names an instance with a store exports besides
// its pipelines' (ferry_store_up, the reloads'), scraped from its /metrics.
func serviceMetrics(t *testing.T) map[string]bool {
	t.Helper()
	svc, err := service.New(service.Config{StoreDSN: testenv.Postgres(t), AdminToken: "deploy-test-admin", DisableHA: true,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	names := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, "the instance's /metrics", func() bool {
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				names[f[2]] = true
			}
		}
		return rec.Code == 200 && names["ferry_store_up"]
	})
	return names
}
