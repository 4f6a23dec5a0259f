package doctor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var harness = plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema, Extra: "poll_interval: 20ms"}

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
	e := relaytest.Setup(t, harness)
	y := e.YAML("fine", 100)
	e.Start(t, y)
	w, _ := plugintest.Insert(context.Background(), e.Pool, "agg-1")
	e.Coll.WaitFor(t, 60*time.Second, "the event", func(m []testenv.Received) bool { return len(m) == 1 })
	d := diagnose(t, load(t, y), opts, "", 0)
	if !d.Healthy || len(d.Checks) != 5 {
		t.Fatalf("diagnosis %+v", d)
	}
	_ = w
}

// No relay is running and rows age: the doctor names the relay.
func TestRelayNotRunning(t *testing.T) {
	e := relaytest.Setup(t, harness)
	plugintest.Insert(context.Background(), e.Pool, "agg-1")
	time.Sleep(600 * time.Millisecond) // let the row age past MaxAge
	d := diagnose(t, load(t, e.YAML("orphan", 100)), opts, doctor.StageRelay, 1)
	if !strings.Contains(strings.Join(d.Checks[1].Evidence, " "), "no Ferry instance is running this pipeline") {
		t.Fatalf("relay evidence: %v", d.Checks[1].Evidence)
	}
}

// A long open transaction holds the xid8 cursor: the doctor names its pid.
func TestOpenTransactionBlocksXid8(t *testing.T) {
	e := relaytest.Setup(t, harness)
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
	if _, err := plugintest.Insert(ctx, e.Pool, "agg-1"); err != nil {
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
	e := relaytest.Setup(t, harness)
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(e.YAML("nobroker", 100), "url: "+e.NATS, "url: "+srv.URL(), 1)
	e.Start(t, y)
	srv.Close()
	plugintest.Insert(context.Background(), e.Pool, "agg-1")
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

// A wal pipeline's slot with no reader retains WAL: the relay says it
// keeps failing (here: a ferry whose API reports backing_off) and the
// doctor names the slot — and advises dropping a slot of its own, never
// the shared one, which holds every member's place.
func TestInactiveSlotRetainingWAL(t *testing.T) {
	for _, mode := range []string{"own", "shared"} {
		t.Run(mode, func(t *testing.T) { inactiveSlotRetainingWAL(t, mode) })
	}
}

func inactiveSlotRetainingWAL(t *testing.T, mode string) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	ctx := context.Background()
	name := strings.ToLower(testenv.Name("slotdoc"))
	y := strings.Replace(e.YAML(name, 100), "type: wal", "type: wal\n  slot_mode: "+mode+"\n  heartbeat_interval: 0s", 1)
	stop := e.Start(t, y)
	plugintest.Insert(ctx, e.Pool, "agg-1")
	e.Coll.WaitFor(t, 60*time.Second, "the event", func(m []testenv.Received) bool { return len(m) == 1 })
	// Until its initial snapshot's rows are acked, a restart reads the
	// snapshot again (an own slot streams a temporary copy until then):
	// stop only after that.
	slot := wal.DefaultName(name)
	settled := `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND NOT temporary`
	if mode == "shared" {
		slot = wal.SharedName(e.Pool.Config().ConnConfig.Database)
		settled = `SELECT count(*) FROM ` + wal.MembersTable + ` WHERE slot = $1 AND snapshot_at IS NULL`
	}
	testenv.Eventually(t, 60*time.Second, "the first start settled", func() bool {
		var n int
		e.Pool.QueryRow(ctx, settled, slot).Scan(&n)
		return n == 1
	})
	stop() // the slot stays, with no reader

	for range 20 { // WAL the slot must retain
		plugintest.Insert(ctx, e.Pool, "agg-2")
	}
	dups := uint64(3)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"pipelines": []engine.Status{{Name: name, State: engine.StateBackingOff,
			Since: time.Now(), Starts: 1, LastError: "replication connection: sorry, too many clients already", Duplicates: &dups}}})
	}))
	defer api.Close()
	o := opts
	o.URL = api.URL
	d := diagnose(t, load(t, y), o, doctor.StageSource, 1)
	src := d.Checks[len(d.Checks)-1]
	drop := "pg_drop_replication_slot('" + slot + "')"
	if !strings.Contains(strings.Join(src.Evidence, " "), "slot "+slot+": active false") || strings.Contains(src.Action, drop) != (mode == "own") ||
		mode == "shared" && !strings.Contains(src.Action, "shared slot "+slot) {
		t.Fatalf("slot check: %+v", src)
	}
	// The relay's duplicates_total is evidence of the relay stage.
	for _, c := range d.Checks {
		if c.Stage == doctor.StageRelay && !strings.Contains(strings.Join(c.Evidence, " "), "publishes since start confirmed by the broker as duplicates, not stored (duplicates_total): 3;") {
			t.Errorf("relay check without the duplicates: %+v", c)
		}
	}
}

// Ferry delivered to Kafka, but a consumer group named in the sink's config
// is behind: the doctor names the consumers.
func TestKafkaConsumerGroupBehind(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	srv := testenv.StartKafka(t)
	topic := strings.ToLower(e.Stream)
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 1)
	y := fmt.Sprintf("name: billing\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: kafka, brokers: [%q], topic: %s, consumer_groups: [billing-service]}\n",
		e.DSN, srv.Addr(), topic)
	e.Start(t, y)
	for range 30 {
		plugintest.Insert(ctx, e.Pool, "agg-1")
	}
	coll := testenv.CollectKafka(t, []string{srv.Addr()}, []string{topic})
	testenv.Eventually(t, 30*time.Second, "30 records on the topic", func() bool { return coll.Len() >= 30 })
	// The billing service committed offset 5 and stopped there.
	testenv.CommitKafkaOffset(t, []string{srv.Addr()}, "billing-service", topic, 5)
	o := opts
	o.MaxConsumerLag = 10
	d := diagnose(t, load(t, y), o, doctor.StageConsumer, 1)
	if ev := strings.Join(d.Checks[len(d.Checks)-1].Evidence, " "); !strings.Contains(ev, "group billing-service on "+topic+": 25 behind") {
		t.Fatalf("consumer evidence: %s", ev)
	}
}

// wal pipelines with slot_mode: shared read through their instance's
// shared stream, whose sessions are named ferry:shared:<slot>: the doctor
// counts them as it counts the shared pool's, instead of saying no
// instance runs the pipeline.
func TestRelayReadsThroughSharedStream(t *testing.T) {
	e := relaytest.Setup(t, harness)
	cfg, err := pgx.ParseConfig(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "ferry:shared:ferry_shared_test"
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	r := doctor.Run(context.Background(), load(t, e.YAML("sharedwal", 100)), opts)
	c := r.Pipelines[0].Checks[1]
	ev := strings.Join(c.Evidence, " ")
	if c.Stage != doctor.StageRelay || c.Status != doctor.OK || !strings.Contains(ev, "ferry:shared:<slot>") {
		t.Fatalf("relay check %s %s: %v", c.Stage, c.Status, c.Evidence)
	}
}
