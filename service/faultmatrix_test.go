package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/service"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/xid8"
)

// via is dsn with its host replaced by a proxy's address.
func via(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// surfaces is what every status surface says at one moment.
type surfaces struct {
	api      map[string]engine.Status
	coord    *engine.Coordination
	ready    int
	readyz   string
	lag      string
	logs     string
	doctored map[string]string // pipeline → doctor's printed report
}

// matrix is one supervisor with an HTTP API, its pipeline specs and log.
type matrix struct {
	t     *testing.T
	sup   *engine.Supervisor
	srv   *httptest.Server
	specs map[string]*pipelines.Spec
	logs  *logBuffer
}

func (m *matrix) look(doctorFor ...string) surfaces {
	t := m.t
	t.Helper()
	var s surfaces
	resp, err := http.Get(m.srv.URL + "/api/v1/pipelines")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Pipelines    []engine.Status      `json:"pipelines"`
		Coordination *engine.Coordination `json:"coordination"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.api, s.coord = map[string]engine.Status{}, body.Coordination
	for _, p := range body.Pipelines {
		s.api[p.Name] = p
	}
	r, err := http.Get(m.srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	s.ready, s.readyz = r.StatusCode, string(b)
	_, s.lag, _ = ferry(t, "lag", "--url", m.srv.URL)
	s.logs = m.logs.String()
	s.doctored = map[string]string{}
	for _, name := range doctorFor {
		rep := doctor.Run(context.Background(), []*pipelines.Spec{m.specs[name]}, doctor.Options{URL: m.srv.URL, Sample: 0,
			MaxAge: time.Second, MaxTransactionAge: time.Second, Timeout: 5 * time.Second})
		var out bytes.Buffer
		rep.Print(&out)
		s.doctored[name] = out.String()
	}
	return s
}

// readyDespite checks that /readyz answered 200 through a fault: it lists
// what does not run (expect checks that), but one pipeline's fault or a
// shared database's does not take the instance out of service.
func readyDespite(t *testing.T, fault string, s surfaces) {
	t.Helper()
	if s.ready != http.StatusOK {
		t.Errorf("%s: /readyz %d, want 200 (the fault shows in its details, not its verdict): %s", fault, s.ready, s.readyz)
	}
}

// expect checks that each surface's text contains what it should.
func expect(t *testing.T, fault, surface, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s: %s lacks %q:\n%s", fault, surface, w, text)
		}
	}
	if strings.Contains(text, "hunter2") {
		t.Errorf("%s: %s shows a password:\n%s", fault, surface, text)
	}
}

// The bounded fault matrix: each fault of the chaos plan in turn — source
// database down, coordination database down, broker down, half-open
// connection, replication slot invalidated, transaction held open — and
// what /api/v1/pipelines, /readyz's details, ferry lag, ferry doctor and
// the log say about it, while /readyz stays 200; meanwhile a pipeline no
// fault touches keeps delivering.
func TestFaultMatrix(t *testing.T) {
	ctx := context.Background()
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_M", 100*time.Millisecond, e.Subject+".>")
	dbAddr := func() string { u, _ := url.Parse(e.DSN); return u.Host }()
	pSrc, pHalf, pCoord := faultproxy.Start(t, dbAddr), faultproxy.Start(t, dbAddr), faultproxy.Start(t, dbAddr)
	broker, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	pNats := faultproxy.Start(t, strings.TrimPrefix(broker.URL(), "nats://"))

	// The replication slot lives on a cluster of its own that invalidates
	// slots 1 MB behind.
	strict, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0",
		"min_wal_size": "32MB", "max_wal_size": "64MB"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { strict.Close() })
	slotDSN := strict.DSN("postgres")
	slotPool, err := pgxpool.New(ctx, slotDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slotPool.Close)
	if _, err := slotPool.Exec(ctx, `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}

	pollDDL, _ := poll.Schema("healthy")
	if _, err := e.Pool.Exec(ctx, pollDDL); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"srcdown", "halfopen", "broker", "held"} {
		ddl, _ := xid8.Schema(table)
		if _, err := e.Pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	xid8Pipe := func(name, dsn, extra string) string {
		return fmt.Sprintf("name: %s\ntenant: team-%s\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 50ms, metrics_interval: 1s%s}\nsink: {type: nats, url: %q, subject: %s.%s}\n",
			name, name, dsn, name, extra, e.NATS, e.Subject, name)
	}
	docs := []string{
		fmt.Sprintf("name: healthy\ntenant: team-healthy\nsource: {type: poll, dsn: %q, table: healthy, poll_interval: 50ms, metrics_interval: 1s}\nsink: {type: nats, url: %q, subject: %s.healthy}\n",
			e.DSN, e.NATS, e.Subject),
		xid8Pipe("srcdown", via(t, e.DSN, pSrc.Addr()), ""),
		xid8Pipe("halfopen", via(t, e.DSN, pHalf.Addr()), ", query_timeout: 2s"),
		strings.Replace(xid8Pipe("broker", e.DSN, ""), "url: "+fmt.Sprintf("%q", e.NATS), fmt.Sprintf("url: %q, create_stream: {name: %s}", "nats://"+pNats.Addr(), strings.ToUpper(testenv.Name("broker"))), 1),
		xid8Pipe("held", e.DSN, ""),
		fmt.Sprintf("name: slot\ntenant: team-slot\nsource: {type: wal, dsn: %q, table: outbox, metrics_interval: 1s}\nsink: {type: nats, url: %q, subject: %s.slot}\n", slotDSN, e.NATS, e.Subject),
	}
	specs, err := pipelines.Loader{}.LoadBytes("matrix.yaml", []byte(strings.Join(docs, "---\n")))
	if err != nil {
		t.Fatal(err)
	}
	m := &matrix{t: t, specs: map[string]*pipelines.Spec{}, logs: &logBuffer{}}
	for _, sp := range specs {
		m.specs[sp.Name] = sp
	}
	reg := prometheus.NewRegistry()
	m.sup, err = engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(m.logs, nil)), Metrics: reg, DrainTimeout: 2 * time.Second,
		Ownership: &engine.Ownership{Instance: "matrix", CoordinationDSN: via(t, e.DSN, pCoord.Addr()), CoordinationFrom: "--coordination-dsn", Interval: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	// Without a store, as ferry run without --store: the converger hands
	// the supervisor the pipelines, and the API serves them.
	conv := &service.Converger{Supervisor: m.sup, LoadFiles: func() ([]*pipelines.Spec, error) { return specs, nil }}
	if err := conv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.sup.Run(runCtx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	m.srv = httptest.NewServer(httpapi.New(httpapi.Options{Supervisor: m.sup, Registry: reg, Control: &httpapi.Control{Converger: conv}}))
	t.Cleanup(m.srv.Close)

	insert := func(pool *pgxpool.Pool, table string) {
		t.Helper()
		if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload)
			VALUES ('order', 'a1', 'Created', '{"agg": "a1", "seq": 1}')`, pgx.Identifier{table}.Sanitize())); err != nil {
			t.Fatal(err)
		}
	}
	delivered := func(name string) int {
		n := 0
		for _, r := range coll.All() {
			if r.Subject == e.Subject+"."+name {
				n++
			}
		}
		return n
	}
	// healthyDelivers proves the untouched pipeline still delivers.
	healthyDelivers := func(fault string) {
		t.Helper()
		before := delivered("healthy")
		insert(e.Pool, "healthy")
		coll.WaitFor(t, 30*time.Second, fault+": the healthy pipeline delivering", func([]testenv.Received) bool { return delivered("healthy") > before })
	}
	state := func(name string) engine.State {
		st, _ := m.sup.Status(name)
		return st.State
	}
	running := func(fault string, names ...string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, fault+": "+strings.Join(names, ", ")+" running", func() bool {
			for _, n := range names {
				if state(n) != engine.StateRunning {
					return false
				}
			}
			return true
		})
	}
	running("start", "healthy", "srcdown", "halfopen", "broker", "held", "slot")
	testenv.Eventually(t, 30*time.Second, "start: every source measured its backlog (fully started)", func() bool {
		for _, st := range m.sup.Statuses() {
			if st.Health == nil || st.Health.CheckedAt.IsZero() {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, 30*time.Second, "start: ready", func() bool { return m.sup.Ready() })
	healthyDelivers("start")

	t.Run("SourceDatabaseDown", func(t *testing.T) {
		pSrc.Cut()
		// A statement cut mid-way fails with "conn closed"; the next attempt,
		// 200 ms later, names the address it cannot reach.
		testenv.Eventually(t, 30*time.Second, "srcdown backing off, naming the address", func() bool {
			st, _ := m.sup.Status("srcdown")
			return st.State == engine.StateBackingOff && strings.Contains(st.LastError, pSrc.Addr())
		})
		s := m.look("srcdown")
		st := s.api["srcdown"]
		expect(t, "source down", "last_error", st.LastError, pSrc.Addr())
		if st.NextRetry.IsZero() {
			t.Error("source down: no next_retry")
		}
		expect(t, "source down", "/readyz", s.readyz, `"pipelines.srcdown"`)
		expect(t, "source down", "ferry lag", s.lag, "srcdown", "backing_off", pSrc.Addr(), "next retry in")
		expect(t, "source down", "doctor", s.doctored["srcdown"], "UNHEALTHY at relay", "state backing_off", pSrc.Addr())
		expect(t, "source down", "log", s.logs, `msg="pipeline failing; retrying with backoff" pipeline=srcdown tenant=team-srcdown`)
		readyDespite(t, "source down", s)
		healthyDelivers("source down")
		pSrc.Heal()
		insert(e.Pool, "srcdown")
		running("source healed", "srcdown")
	})

	t.Run("CoordinationDatabaseDown", func(t *testing.T) {
		pCoord.Cut()
		testenv.Eventually(t, 30*time.Second, "coordination reported down", func() bool { c, _ := m.sup.Coordination(); return !c.Up })
		s := m.look("healthy")
		if s.coord == nil || s.coord.Up {
			t.Fatalf("coordination down: API says %+v", s.coord)
		}
		expect(t, "coordination down", "coordination.last_error", s.coord.LastError, pCoord.Addr())
		expect(t, "coordination down", "/readyz", s.readyz, `"ha.coordination"`)
		expect(t, "coordination down", "ferry lag", s.lag, "HA DEGRADED", pCoord.Addr())
		expect(t, "coordination down", "doctor", s.doctored["healthy"], "instance: coordination unhealthy", pCoord.Addr())
		expect(t, "coordination down", "log", s.logs, `msg="coordination database unreachable`)
		readyDespite(t, "coordination down", s)
		for name, st := range s.api {
			if st.State != engine.StateRunning {
				t.Errorf("coordination down: %s is %s; every pipeline keeps running", name, st.State)
			}
		}
		healthyDelivers("coordination down")
		pCoord.Heal()
		testenv.Eventually(t, 30*time.Second, "coordination back, ready", func() bool { return m.sup.Ready() })
		expect(t, "coordination healed", "log", m.logs.String(), `msg="coordination database reachable again`)
	})

	t.Run("BrokerDown", func(t *testing.T) {
		pNats.Cut()
		insert(e.Pool, "broker")
		testenv.Eventually(t, 30*time.Second, "broker pipeline backing off", func() bool { return state("broker") == engine.StateBackingOff })
		s := m.look("broker")
		expect(t, "broker down", "last_error", s.api["broker"].LastError, "nats: no servers available", pNats.Addr())
		expect(t, "broker down", "/readyz", s.readyz, `"pipelines.broker"`)
		readyDespite(t, "broker down", s)
		expect(t, "broker down", "ferry lag", s.lag, "broker", "backing_off", "nats: no servers available")
		expect(t, "broker down", "doctor", s.doctored["broker"], "UNHEALTHY at broker", "nats: no servers available")
		expect(t, "broker down", "log", s.logs, `pipeline=broker tenant=team-broker`)
		healthyDelivers("broker down")
		pNats.Heal()
		running("broker healed", "broker")
	})

	t.Run("HalfOpenConnection", func(t *testing.T) {
		pHalf.Blackhole()
		insert(e.Pool, "halfopen")
		// The surfaces are read together, once the API shows the cause: a
		// retry may be between attempts when the state first flips.
		var s surfaces
		testenv.Eventually(t, 60*time.Second, "halfopen backing off with a timeout named", func() bool {
			if state("halfopen") != engine.StateBackingOff {
				return false
			}
			s = m.look()
			st := s.api["halfopen"]
			return st.State == engine.StateBackingOff &&
				(strings.Contains(st.LastError, "timeout") || strings.Contains(st.LastError, "deadline"))
		})
		expect(t, "half-open", "/readyz", s.readyz, `"pipelines.halfopen"`)
		readyDespite(t, "half-open", s)
		expect(t, "half-open", "ferry lag", s.lag, "halfopen", "backing_off")
		expect(t, "half-open", "log", s.logs, `pipeline=halfopen tenant=team-halfopen`)
		healthyDelivers("half-open")
		pHalf.Heal()
		running("half-open healed", "halfopen")
	})

	t.Run("SlotInvalidated", func(t *testing.T) {
		if err := m.sup.Pause("slot"); err != nil {
			t.Fatal(err)
		}
		insert(slotPool, "outbox")
		testenv.Eventually(t, 60*time.Second, "the slot invalidated", func() bool {
			if _, err := slotPool.Exec(ctx, `SELECT pg_switch_wal(); CREATE TEMP TABLE IF NOT EXISTS f (x int); INSERT INTO f VALUES (1); CHECKPOINT`); err != nil {
				t.Fatal(err)
			}
			var status string
			_ = slotPool.QueryRow(ctx, `SELECT COALESCE(wal_status, '') FROM pg_replication_slots WHERE slot_name = 'ferry_shared_postgres'`).Scan(&status) // the default slot_mode, shared
			return status == "lost"
		})
		if err := m.sup.Resume("slot"); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "slot pipeline failed", func() bool { return state("slot") == engine.StateFailed })
		s := m.look("slot")
		expect(t, "slot lost", "last_error", s.api["slot"].LastError, "was lost", "max_slot_wal_keep_size", "DELETE FROM ferry_wal_members")
		expect(t, "slot lost", "/readyz", s.readyz, `"pipelines.slot"`)
		readyDespite(t, "slot lost", s)
		expect(t, "slot lost", "ferry lag", s.lag, "slot", "failed", "was lost")
		expect(t, "slot lost", "doctor", s.doctored["slot"], "UNHEALTHY", "lost")
		expect(t, "slot lost", "log", s.logs, `pipeline=slot tenant=team-slot`, "was lost")
		healthyDelivers("slot lost")
		if err := m.sup.Stop("slot"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("HeldTransaction", func(t *testing.T) {
		tx, err := e.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var pid int
		if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		before := delivered("held")
		insert(e.Pool, "held")
		var last engine.Status
		testenv.Eventually(t, 30*time.Second, "held's backlog shown", func() bool {
			last, _ = m.sup.Status("held")
			return last.Health != nil && last.Health.Backlog >= 1 && last.Health.XminHorizonAge() > time.Second
		})
		t.Logf("held: %s, health %+v", last.State, *last.Health)
		s := m.look("held")
		expect(t, "held transaction", "ferry lag", s.lag, "held", "1 events")
		expect(t, "held transaction", "doctor", s.doctored["held"], "UNHEALTHY at source", fmt.Sprintf("pid %d", pid))
		if delivered("held") != before {
			t.Error("held transaction: an event committed after the open transaction's start was delivered before it ended")
		}
		healthyDelivers("held transaction")
		_ = tx.Rollback(ctx)
		coll.WaitFor(t, 30*time.Second, "held's event once the transaction ended", func([]testenv.Received) bool { return delivered("held") > before })
	})
}
