package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Fault is one thing the suite breaks.
type Fault string

// The faults.
const (
	// Kill: SIGKILL the Ferry process, start a new one.
	Kill Fault = "kill"
	// BrokerRestart: stop the broker for the outage, start it again.
	BrokerRestart Fault = "broker-restart"
	// PGCrash: stop PostgreSQL with `-m immediate`, start it again (crash
	// recovery).
	PGCrash Fault = "pg-crash"
	// BrokerCut, PGCut: reset Ferry's connections to the broker (or the
	// database) and refuse new ones for the outage.
	BrokerCut Fault = "broker-cut"
	PGCut     Fault = "pg-cut"
	// BrokerStall, PGStall: freeze Ferry's connections to the broker (or
	// the database) for the outage; then the held bytes flow on.
	BrokerStall Fault = "broker-stall"
	PGStall     Fault = "pg-stall"
	// BrokerBlackhole, PGBlackhole: freeze Ferry's connections to the
	// broker (or the database) for good; connections opened after the
	// outage work. Ferry has to notice the dead ones itself.
	BrokerBlackhole Fault = "broker-blackhole"
	PGBlackhole     Fault = "pg-blackhole"
)

// Sources and Sinks are every source and sink the suite runs.
var (
	Sources = []string{"xid8", "poll", "wal"}
	Sinks   = []string{"nats", "kafka", "rabbitmq"}
)

// OrderPromised reports whether a source promises per-aggregate commit
// order (README, Guarantees): xid8 and wal do; poll only within one
// worker's claims, so its violations are reported, not failed.
func OrderPromised(source string) bool { return source != "poll" }

// Scenario is a named sequence of faults injected while a writer commits
// randomized interleavings.
type Scenario struct {
	Name   string
	Faults []Fault
	// Rounds, when set, is how many interleavings the writer commits (and
	// the scenario ends when they are delivered); else the writer runs
	// until the faults are done.
	Rounds int
	// Overlap is the chance that a fault follows the previous one before
	// the pipeline recovered from it (mixed scenarios).
	Overlap float64
	// Outage, when set, replaces Config.Outage.
	Outage time.Duration
}

// Counts sizes a run of the suite.
type Counts struct {
	Kills, BrokerRestarts, PGCrashes int
	// NetCuts is how many network faults each of the broker and database
	// links gets, alternating cut and stall.
	NetCuts int
	// HalfOpen is how many half-open connections, alternately to the
	// database and to the broker.
	HalfOpen int
	// LongOutages is how many times the broker is unreachable for
	// LongOutage (a network cut, so the machine's shared RabbitMQ keeps
	// running for everyone else).
	LongOutages   int
	Interleavings int
	// Mixed is how many faults, of every kind, the mixed scenario injects.
	Mixed int
}

// Scenarios lists the scenarios for counts: each fault alone, the
// interleavings without faults, and all of them mixed.
func Scenarios(c Counts, seed uint64) []Scenario {
	rep := func(f Fault, n int) []Fault { return slices.Repeat([]Fault{f}, n) }
	alternate := func(a, b Fault, n int) []Fault {
		out := make([]Fault, n)
		for i := range out {
			out[i] = a
			if i%2 == 1 {
				out[i] = b
			}
		}
		return out
	}
	var ss []Scenario
	add := func(s Scenario) {
		if len(s.Faults) > 0 || s.Rounds > 0 {
			ss = append(ss, s)
		}
	}
	add(Scenario{Name: "kill", Faults: rep(Kill, c.Kills)})
	add(Scenario{Name: "broker-restart", Faults: rep(BrokerRestart, c.BrokerRestarts)})
	add(Scenario{Name: "pg-crash", Faults: rep(PGCrash, c.PGCrashes)})
	add(Scenario{Name: "net-broker", Faults: alternate(BrokerCut, BrokerStall, c.NetCuts)})
	add(Scenario{Name: "net-pg", Faults: alternate(PGCut, PGStall, c.NetCuts)})
	add(Scenario{Name: "half-open", Faults: alternate(PGBlackhole, BrokerBlackhole, c.HalfOpen)})
	add(Scenario{Name: "long-outage", Faults: rep(BrokerCut, c.LongOutages), Outage: LongOutage})
	add(Scenario{Name: "interleavings", Rounds: c.Interleavings})
	if c.Mixed > 0 {
		all := []Fault{Kill, BrokerRestart, PGCrash, BrokerCut, BrokerStall, PGCut, PGStall}
		rng := rand.New(rand.NewPCG(seed, 0x0d15))
		m := Scenario{Name: "mixed", Overlap: 0.3}
		for i := range c.Mixed {
			// Every kind at least once, then at random.
			f := all[i%len(all)]
			if i >= len(all) {
				f = all[rng.IntN(len(all))]
			}
			m.Faults = append(m.Faults, f)
		}
		rng.Shuffle(len(m.Faults), func(i, j int) { m.Faults[i], m.Faults[j] = m.Faults[j], m.Faults[i] })
		add(m)
	}
	return ss
}

// LongOutage is how long the long-outage scenario keeps the broker away:
// longer than a minute, as a broker's rolling restart or a failover takes.
const LongOutage = 75 * time.Second

// Config is how one scenario runs.
type Config struct {
	Source, Sink string
	// MaxInFlight is the pipeline's limits.max_in_flight: the duplicate
	// bound per fault.
	MaxInFlight int
	// Outage is how long a broker or the database stays down and a network
	// fault lasts.
	Outage time.Duration
	// Settle is how many new events must arrive before the next fault, so
	// each one hits a pipeline that runs mid-stream.
	Settle int
	// Writer shapes the traffic.
	Writer WriterConfig
	// RecoveryTimeout bounds each recovery; DrainTimeout the final delivery
	// of everything committed.
	RecoveryTimeout, DrainTimeout time.Duration
	// Seed drives fault timing and the writer.
	Seed uint64
	// ChildArgs are the `ferry run` flags after `-c FILE`; default ChildArgs.
	ChildArgs []string
	// SourceYAML is added to the pipeline's source section (keys indented
	// two spaces), e.g. "  max_attempts: 3\n".
	SourceYAML string
}

// DefaultConfig is the configuration the suite runs source × sink with.
func DefaultConfig(source, sink string) Config {
	return Config{Source: source, Sink: sink, MaxInFlight: 100, Outage: 2 * time.Second, Settle: 50,
		Writer: DefaultWriterConfig(), RecoveryTimeout: 2 * time.Minute, DrainTimeout: 3 * time.Minute, Seed: 1, ChildArgs: ChildArgs}
}

// Result is one scenario's outcome: the row of the reliability table.
type Result struct {
	Scenario, Source, Sink string
	Faults                 int
	Rounds                 int // interleavings the writer committed
	Events                 int // committed events
	Deliveries             int // messages on the broker
	Lost                   int
	Phantom                int // delivered, never committed
	RolledBackDelivered    int
	OrderViolations        int
	OrderPromised          bool
	Duplicates             int
	DuplicateBound         int
	// Recovery is, per fault the pipeline was given time to recover from,
	// the time from the fault's end to the first new event on the broker.
	Recovery []time.Duration
	Duration time.Duration
	// Failures say why the scenario failed; empty when it passed.
	Failures []string
	// Notes explain the numbers (e.g. where a duplicate bound comes from).
	Notes []string
	// Log is the Ferry process's output (tail, for failures).
	Log string
}

// Passed reports whether every verdict held.
func (r Result) Passed() bool { return len(r.Failures) == 0 }

// run is one scenario's moving parts.
type run struct {
	t       testing.TB
	cfg     Config
	sc      Scenario
	db      *Database
	pgProxy *faultproxy.Proxy
	bProxy  *faultproxy.Proxy
	broker  Broker
	ver     *Verifier
	path    string
	logPath string
	child   *Child
	name    string
	rng     *rand.Rand
	res     *Result
	// walExtra is what the database itself may re-send after a crash: the
	// wal slot's position is persisted only at checkpoints (PostgreSQL's
	// documented behaviour), so it can go back to before events Ferry had
	// confirmed.
	walExtra int
	// pgCrashes counts the PostgreSQL crashes injected so far.
	pgCrashes int
}

// Run runs one scenario for cfg.Source × cfg.Sink and returns its result;
// setup problems fail t at once, verdicts are in the result.
func Run(t testing.TB, cfg Config, sc Scenario) Result {
	t.Helper()
	if sc.Outage > 0 {
		cfg.Outage = sc.Outage
	}
	r := &run{t: t, cfg: cfg, sc: sc, rng: rand.New(rand.NewPCG(cfg.Seed, 0xc4a05)),
		res: &Result{Scenario: sc.Name, Source: cfg.Source, Sink: cfg.Sink, Faults: len(sc.Faults), OrderPromised: OrderPromised(cfg.Source)}}
	began := time.Now()
	r.setup()
	r.exercise()
	r.res.Duration = time.Since(began)
	return *r.res
}

func (r *run) fail(format string, args ...any) {
	r.res.Failures = append(r.res.Failures, fmt.Sprintf(format, args...))
}

func (r *run) note(format string, args ...any) {
	r.res.Notes = append(r.res.Notes, fmt.Sprintf(format, args...))
}

func (r *run) setup() {
	t := r.t
	r.db = NewDatabase(t)
	var ddl string
	var err error
	switch r.cfg.Source {
	case "xid8":
		ddl, err = xid8.Schema("outbox")
	case "poll":
		ddl, err = poll.Schema("outbox")
	case "wal":
		ddl, err = wal.Schema("outbox")
	default:
		t.Fatalf("unknown source %q", r.cfg.Source)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.db.Pool.Exec(ctx, ddl); err != nil {
		t.Fatalf("create outbox: %v", err)
	}
	// agg_seq numbers each aggregate's events in commit order (the writers
	// serialise on an advisory lock first; see insertSQL).
	if _, err := r.db.Pool.Exec(ctx, r.cfg.Writer.SchemaSQL()); err != nil {
		t.Fatal(err)
	}
	r.pgProxy = faultproxy.Start(t, r.db.Addr())
	r.bProxy = faultproxy.Start(t, "")
	r.broker = StartBroker(t, r.cfg.Sink, r.bProxy)
	r.bProxy.SetTarget(r.broker.Addr())
	r.ver = startVerifier(t, r.broker.feed(t))

	r.name = strings.ReplaceAll(testenv.Name("chaos_"+r.cfg.Source), "-", "_")
	extra := ""
	if r.cfg.Source == "poll" {
		// A killed worker's claims wait for their lease to expire: shorter
		// than the 30s default so a run with many kills drains in time.
		extra = "  lease: 10s\n"
	}
	extra += r.cfg.SourceYAML
	// The headers transform stamps sent_at on every publish attempt: the
	// recovery clock.
	yaml := fmt.Sprintf("name: %s\nsource:\n  type: %s\n  dsn: %s\n  table: outbox\n%stransforms:\n  - type: headers\nsink:\n  type: %s\n%slimits:\n  max_in_flight: %d\n",
		r.name, r.cfg.Source, r.db.DSNVia(r.pgProxy.Addr()), extra, r.cfg.Sink, r.broker.SinkYAML(r.bProxy.Addr()), r.cfg.MaxInFlight)
	dir := t.TempDir()
	r.path = filepath.Join(dir, "pipeline.yaml")
	r.logPath = filepath.Join(dir, "ferry.log")
	if err := os.WriteFile(r.path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (r *run) exercise() {
	ctx, stopWriting := context.WithCancel(context.Background())
	defer stopWriting()
	wcfg := r.cfg.Writer
	wcfg.Seed = r.cfg.Seed
	w := NewWriter(r.db.Pool, wcfg)
	written := make(chan struct{})
	go func() { defer close(written); w.Run(ctx, r.sc.Rounds) }()

	r.child = StartChild(r.t, r.path, r.logPath, r.cfg.ChildArgs)
	defer func() {
		r.child.Kill()
		r.res.Log = tail(r.logPath, 60)
		if dir := os.Getenv("FERRY_CHAOS_LOGS"); dir != "" {
			b, _ := os.ReadFile(r.logPath)
			_ = os.MkdirAll(dir, 0o755)
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%s.log", r.cfg.Source, r.cfg.Sink, r.sc.Name)), b, 0o644)
		}
	}()
	if err := r.ver.WaitNew(0, 1, r.cfg.RecoveryTimeout); err != nil {
		r.fail("the pipeline never delivered: %v", err)
		stopWriting()
		<-written
		return
	}
	recovered := true
	for i, f := range r.sc.Faults {
		if recovered || r.rng.Float64() >= r.sc.Overlap {
			if err := r.ver.WaitNew(r.ver.Distinct(), r.cfg.Settle, r.cfg.RecoveryTimeout); err != nil {
				r.fail("before fault %d (%s): %v", i+1, f, err)
				break
			}
			// Land the fault at a random point of the stream.
			time.Sleep(time.Duration(r.rng.Int64N(int64(300 * time.Millisecond))))
		}
		end, readAfter := r.inject(f)
		recovered = i == len(r.sc.Faults)-1 || r.rng.Float64() >= r.sc.Overlap
		if !recovered {
			continue // the next fault hits a pipeline still recovering
		}
		d, err := r.ver.WaitRecovered(end, readAfter, r.cfg.RecoveryTimeout)
		if err != nil {
			r.fail("fault %d (%s): %v", i+1, f, err)
			break
		}
		r.res.Recovery = append(r.res.Recovery, d)
		if os.Getenv("FERRY_CHAOS_TRACE") != "" {
			fd, _ := r.ver.firstAfter(end, readAfter)
			r.t.Logf("fault %d %s: end %s, first new event %d read %s sent %s stored %s seen %s", i+1, f, end.Format("15:04:05.000"), fd.OutboxID,
				fd.ReadAt.Format("15:04:05.000"), fd.SentAt.Format("15:04:05.000"), fd.Stored.Format("15:04:05.000"), fd.At.Format("15:04:05.000"))
		}
	}
	if r.sc.Rounds == 0 {
		stopWriting()
	}
	<-written
	r.judge(w)
}

// inject breaks one thing and repairs it; it returns when the fault ended,
// and the time after which a read proves the pipeline recovered (the kill:
// only the new process's reads count).
func (r *run) inject(f Fault) (end, readAfter time.Time) {
	t := r.t
	switch f {
	case Kill:
		readAfter = time.Now()
		r.child.Kill()
		r.child = StartChild(t, r.path, r.logPath, r.cfg.ChildArgs)
	case BrokerRestart:
		if !r.broker.Restartable() {
			t.Fatalf("%s broker cannot be restarted here", r.cfg.Sink)
		}
		start := r.broker.Stop(t)
		time.Sleep(r.cfg.Outage) // the outage under test
		start(t)
	case PGCrash:
		r.pgCrash()
	case BrokerCut:
		r.outage(r.bProxy.Cut, r.bProxy.Heal)
	case BrokerStall:
		r.outage(r.bProxy.Stall, r.bProxy.Heal)
	case PGCut:
		r.outage(r.pgProxy.Cut, r.pgProxy.Heal)
	case PGStall:
		r.outage(r.pgProxy.Stall, r.pgProxy.Heal)
	case BrokerBlackhole:
		r.outage(r.bProxy.Blackhole, r.bProxy.Heal)
	case PGBlackhole:
		r.outage(r.pgProxy.Blackhole, r.pgProxy.Heal)
	default:
		t.Fatalf("unknown fault %q", f)
	}
	return time.Now(), readAfter
}

// outage breaks the network for the configured outage, then heals it.
func (r *run) outage(brk, heal func()) {
	brk()
	time.Sleep(r.cfg.Outage)
	heal()
}

// pgCrash crashes the cluster and starts it again. Ferry's link stays cut
// until the restarted server was looked at: for wal, the slot's position
// after crash recovery says how much the database itself will send again.
func (r *run) pgCrash() {
	r.pgCrashes++
	if err := r.db.Crash(); err != nil {
		r.t.Fatalf("crash PostgreSQL: %v", err)
	}
	r.pgProxy.Cut()
	time.Sleep(r.cfg.Outage)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := r.db.Restart(ctx); err != nil {
		r.t.Fatalf("restart PostgreSQL: %v", err)
	}
	if r.cfg.Source == "wal" {
		r.walExtra += r.walRegression(ctx)
	}
	r.pgProxy.Heal()
}

// walRegression counts the events already on the broker that the slot,
// as crash recovery left it, will stream again.
func (r *run) walRegression(ctx context.Context) int {
	slot := wal.DefaultName(r.name)
	lsnText, err := r.db.Slot(ctx, slot)
	for err != nil && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		lsnText, err = r.db.Slot(ctx, slot)
	}
	if err != nil || lsnText == "" {
		r.note("pg-crash: slot position unreadable after restart: %v", err)
		return 0
	}
	restored, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return 0
	}
	n := 0
	seen := map[int64]bool{}
	for _, d := range r.ver.All() {
		lsn, err := pglogrepl.ParseLSN(d.CommitLSN)
		if err != nil || seen[d.OutboxID] {
			continue
		}
		seen[d.OutboxID] = true
		if lsn >= restored {
			n++
		}
	}
	return n
}

// judge waits for everything committed to arrive, stops Ferry gracefully
// and computes the verdicts.
func (r *run) judge(w *Writer) {
	ctx := context.Background()
	truth, err := Truth(ctx, r.db.Pool)
	if err != nil {
		r.t.Fatalf("read the outbox: %v", err)
	}
	ids := make([]int64, len(truth))
	for i, e := range truth {
		ids[i] = e.OutboxID
	}
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for !r.ver.Has(ids) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !r.ver.Has(ids) {
		// Stuck: have the Go runtime write every goroutine's stack to the
		// log (FERRY_CHAOS_LOGS keeps it).
		r.child.Dump()
		r.note("not everything arrived within %s of the last fault: the log holds the Ferry process's goroutines (SIGQUIT)", r.cfg.DrainTimeout)
	} else if err := r.child.Stop(30 * time.Second); err != nil {
		r.fail("Ferry did not stop cleanly on SIGTERM: %v", err)
	}
	got := r.ver.All()
	if n, err := r.ver.Errors(); n > 0 {
		r.note("the verifier's broker reads failed %d times, last: %v", n, err)
	}
	rb := w.RolledBack()
	v := Judge(truth, rb, got)
	ws := w.Stats()
	res := r.res
	res.Rounds, res.Events, res.Deliveries = ws.Rounds, v.Events, v.Deliveries
	res.Lost, res.Phantom, res.RolledBackDelivered = len(v.Lost), len(v.Phantom), len(v.RolledBack)
	res.OrderViolations, res.Duplicates = v.OrderViolations, v.Duplicates
	res.DuplicateBound = r.cfg.MaxInFlight*max(1, res.Faults) + r.walExtra
	if r.walExtra > 0 {
		r.note("duplicate bound includes %d events the wal slot streamed again after crash recovery (its position is persisted at checkpoints)", r.walExtra)
	}

	failures, notes := checkWriter(w.Committed(), rb, truth, r.pgCrashes > 0)
	res.Failures = append(res.Failures, failures...)
	res.Notes = append(res.Notes, notes...)
	if ws.InDoubt > 0 {
		r.note("%d events' COMMIT failed during a fault; the table decided them", ws.InDoubt)
	}
	if len(v.Lost) > 0 {
		r.fail("%d committed events never arrived, e.g. outbox ids %v", len(v.Lost), v.Lost[:min(len(v.Lost), 10)])
	}
	if len(v.RolledBack) > 0 {
		r.fail("%d rolled-back events were delivered, e.g. %v", len(v.RolledBack), v.RolledBack[:min(len(v.RolledBack), 10)])
	} else if len(v.Phantom) > 0 {
		r.fail("%d delivered events were never committed, e.g. %v", len(v.Phantom), v.Phantom[:min(len(v.Phantom), 10)])
	}
	if v.OrderViolations > 0 && os.Getenv("FERRY_CHAOS_TRACE") != "" {
		r.traceOrder(v, got)
	}
	if v.OrderViolations > 0 {
		if res.OrderPromised {
			r.fail("%d per-aggregate order violations, e.g. %v", v.OrderViolations, v.Examples)
		} else {
			r.note("%d events arrived before an earlier event of their aggregate (poll: order holds only within one worker's claims), e.g. %v", v.OrderViolations, v.Examples)
		}
	}
	if v.Duplicates > res.DuplicateBound {
		r.fail("%d duplicates, more than the bound %d", v.Duplicates, res.DuplicateBound)
	}
	if res.Events == 0 {
		r.fail("no events were committed")
	}
}

// traceOrder logs, for each aggregate with an order violation, every
// delivery of it around the violation and the rows' transaction ids where
// the table has them (xid8).
func (r *run) traceOrder(v Verdict, got []Delivery) {
	traced := map[string]bool{}
	for _, ex := range v.Examples {
		agg, _, _ := strings.Cut(ex, ":")
		if traced[agg] {
			continue
		}
		traced[agg] = true
		xact := map[int64]string{}
		if r.cfg.Source == "xid8" {
			rows, err := r.db.Pool.Query(context.Background(), `SELECT id, xact_id::text FROM outbox WHERE aggregate_id = $1`, agg)
			if err == nil {
				for rows.Next() {
					var id int64
					var x string
					if rows.Scan(&id, &x) == nil {
						xact[id] = x
					}
				}
				rows.Close()
			}
		}
		for i, d := range got {
			if d.Aggregate == agg {
				r.t.Logf("trace %s #%d: outbox id %d seq %d xact %s first %v read %s sent %s stored %s", agg, i, d.OutboxID, d.Seq, xact[d.OutboxID], d.First,
					d.ReadAt.Format("15:04:05.000000"), d.SentAt.Format("15:04:05.000000"), d.Stored.Format("15:04:05.000000"))
			}
		}
	}
}

// checkWriter holds the writer's own records against the table: a commit
// that returned must be there, a rollback must not — except after a crash
// of PostgreSQL, which may hand a rolled-back transaction's ids out again:
// a sequence's advance is written to the WAL ahead of use but flushed only
// by a commit, so crash recovery can put the sequence back before ids that
// only rolled-back transactions had drawn, and a later commit gets them.
// Such a row is a new event under an old id, and the verifier judges it as
// one.
func checkWriter(committed []plugintest.Written, rolledBack []int64, truth []plugintest.Written, crashed bool) (failures, notes []string) {
	inTable := make(map[int64]bool, len(truth))
	for _, e := range truth {
		inTable[e.OutboxID] = true
	}
	for _, e := range committed {
		if !inTable[e.OutboxID] {
			failures = append(failures, fmt.Sprintf("harness: outbox id %d committed but not in the table (the database lost a commit)", e.OutboxID))
			break
		}
	}
	var reissued []int64
	for _, id := range rolledBack {
		if inTable[id] {
			reissued = append(reissued, id)
		}
	}
	switch {
	case len(reissued) == 0:
	case crashed:
		notes = append(notes, fmt.Sprintf("%d outbox ids of rolled-back transactions were drawn again by later commits after crash recovery "+
			"(the sequence's advance had not been flushed), e.g. %v", len(reissued), reissued[:min(len(reissued), 5)]))
	default:
		failures = append(failures, fmt.Sprintf("harness: outbox id %d rolled back but in the table", reissued[0]))
	}
	return failures, notes
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
