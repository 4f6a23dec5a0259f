package doctor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var harness = sourcetest.Harness{Type: xid8.Name, Schema: xid8.Schema, Extra: "poll_interval: 20ms"}

func load(t *testing.T, yaml string) []*pipelines.Spec {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("doctor.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return specs
}

var opts = doctor.Options{MaxAge: 500 * time.Millisecond, MaxTransactionAge: 500 * time.Millisecond, Sample: 100 * time.Millisecond, Timeout: 5 * time.Second}

// diagnose runs the doctor and checks the stage it names and its exit code.
func diagnose(t *testing.T, specs []*pipelines.Spec, o doctor.Options, stage string, code int) doctor.Diagnosis {
	t.Helper()
	r := doctor.Run(context.Background(), specs, o)
	var out strings.Builder
	r.Print(&out)
	t.Logf("doctor says:\n%s", out.String())
	if r.ExitCode() != code || r.Pipelines[0].Stage != stage {
		t.Fatalf("exit %d at stage %q, want %d at %q", r.ExitCode(), r.Pipelines[0].Stage, code, stage)
	}
	return r.Pipelines[0]
}

func TestHealthy(t *testing.T) {
	e := sourcetest.Setup(t, harness)
	y := e.YAML("fine", 100)
	e.Start(t, y)
	w, _ := sourcetest.Insert(context.Background(), e.Pool, "agg-1")
	e.Coll.WaitFor(t, 10*time.Second, "the event", func(m []testenv.Received) bool { return len(m) == 1 })
	d := diagnose(t, load(t, y), opts, "", 0)
	if !d.Healthy || len(d.Checks) != 5 {
		t.Fatalf("diagnosis %+v", d)
	}
	_ = w
}

// No relay is running and rows age: the doctor names the relay.
func TestRelayNotRunning(t *testing.T) {
	e := sourcetest.Setup(t, harness)
	sourcetest.Insert(context.Background(), e.Pool, "agg-1")
	time.Sleep(600 * time.Millisecond) // let the row age past MaxAge
	d := diagnose(t, load(t, e.YAML("orphan", 100)), opts, doctor.StageRelay, 1)
	if !strings.Contains(strings.Join(d.Checks[1].Evidence, " "), "no Ferry instance is running this pipeline") {
		t.Fatalf("relay evidence: %v", d.Checks[1].Evidence)
	}
}

// A long open transaction holds the xid8 cursor: the doctor names its pid.
func TestOpenTransactionBlocksXid8(t *testing.T) {
	e := sourcetest.Setup(t, harness)
	ctx := context.Background()
	y := e.YAML("blocked", 100)
	e.Start(t, y)
	tx, err := e.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var pid int
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text`).Scan(&pid, &xid); err != nil {
		t.Fatal(err)
	}
	if _, err := sourcetest.Insert(ctx, e.Pool, "agg-1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // the transaction and the row grow older than the limits
	d := diagnose(t, load(t, y), opts, doctor.StageSource, 1)
	src := d.Checks[len(d.Checks)-1]
	if !strings.Contains(strings.Join(src.Evidence, " "), fmt.Sprintf("pid %d", pid)) || !strings.Contains(src.Action, fmt.Sprint(pid)) {
		t.Fatalf("source check does not name pid %d: %+v", pid, src)
	}
}

// The broker is gone while the relay runs: the doctor names the broker.
func TestBrokerDown(t *testing.T) {
	e := sourcetest.Setup(t, harness)
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(e.YAML("nobroker", 100), "url: "+e.NATS, "url: "+srv.URL(), 1)
	e.Start(t, y)
	srv.Close()
	sourcetest.Insert(context.Background(), e.Pool, "agg-1")
	time.Sleep(600 * time.Millisecond)
	diagnose(t, load(t, y), opts, doctor.StageBroker, 1)
}

func TestCannotCheck(t *testing.T) {
	specs := load(t, "name: nowhere\nsource: {type: xid8, dsn: 'postgres://ferry@127.0.0.1:1/db'}\nsink: {type: nats, url: 'nats://127.0.0.1:1', subject: x}\n")
	o := opts
	o.Timeout = time.Second
	r := doctor.Run(context.Background(), specs, o)
	if r.ExitCode() == 0 {
		t.Fatalf("an unreachable database was reported healthy: %+v", r)
	}
}
