package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

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
	// walCrashes are the crashes of a wal run: when each struck and where
	// crash recovery left the slot. walExtra is counted from them once
	// every delivery is in (judge): at the restart, the verifier may not
	// have read yet what the relay published just before the crash.
	walCrashes []walCrash
	// walRereads is what faults may re-send beyond the window while the wal
	// source still streams from its initial snapshot's slot (see
	// walSnapshotRereads).
	walRereads int
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
	if r.cfg.Source == "wal" {
		// The duplicate bounds below read the pipeline's own slot (its
		// promotion after the initial snapshot, its position after a
		// crash): the shared slot's members are tested in sources/wal.
		extra = "  slot_mode: own\n"
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
			// One file per run: -count=N keeps every run's log.
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-%s-%s.log", r.cfg.Source, r.cfg.Sink, r.sc.Name, time.Now().Format("150405.000"))), b, 0o644)
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
	if r.cfg.Source == "wal" && f != PGCrash {
		// Any fault may restart the source (a crash's own account is
		// walCrash.noSlot).
		r.walRereads += r.walSnapshotRereads()
	}
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
	struck := time.Now()
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
		if c, ok := r.slotAfterRecovery(ctx); ok {
			c.struck = struck
			r.walCrashes = append(r.walCrashes, c)
		}
	}
	r.pgProxy.Heal()
}

// walSnapshotRereads is what a fault about to land (a kill, a cut or
// stalled connection, a broker outage: each can restart the source) makes
// the wal source send again beyond its in-flight window: until the initial snapshot's
// rows are acked, the source streams from a temporary copy of its slot and
// creates the configured slot from it only then (promotion); a restart
// before that reads the snapshot again, by design, and sends each row
// committed so far once more. Those rows bound it; 0 once the configured
// slot exists. On a loaded machine the first kill often lands before the
// promotion, and so does a PostgreSQL cut (found by net-pg: 210 duplicates
// against 200, the restart reading 638 snapshot rows).
func (r *run) walSnapshotRereads() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lsn, err := r.db.Slot(ctx, wal.DefaultName(r.name))
	if err != nil {
		r.note("slot unreadable before a fault: %v", err)
		return 0
	}
	if lsn != "" {
		return 0
	}
	var rows int
	if err := r.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&rows); err != nil {
		r.note("outbox rows unreadable before a fault: %v", err)
		return 0
	}
	return rows
}

// walCrash is one crash of a wal run's database.
type walCrash struct {
	struck   time.Time     // when the crash was injected
	restored pglogrepl.LSN // the slot's confirmed position after recovery
	// noSlot: the configured slot did not exist after recovery — the crash
	// struck while the source still streamed its initial snapshot's
	// temporary slot, which the crash dropped — so the restart reads the
	// snapshot again and sends every row read so far once more.
	noSlot bool
}

// slotAfterRecovery is the slot's position as crash recovery left it.
func (r *run) slotAfterRecovery(ctx context.Context) (walCrash, bool) {
	slot := wal.DefaultName(r.name)
	lsnText, err := r.db.Slot(ctx, slot)
	for err != nil && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		lsnText, err = r.db.Slot(ctx, slot)
	}
	if err != nil {
		r.note("pg-crash: slot position unreadable after restart: %v", err)
		return walCrash{}, false
	}
	if lsnText == "" {
		r.note("pg-crash: slot %s did not exist after recovery: the crash struck before the initial snapshot's slot was promoted", slot)
		return walCrash{noSlot: true}, true
	}
	restored, err := pglogrepl.ParseLSN(lsnText)
	return walCrash{restored: restored}, err == nil
}

// walRegression counts, per crash, the events the relay had read before
// it struck from at or past where recovery left the slot: the slot
// streams each of them again. It runs on every delivery (the judge's), so
// a verifier still behind the broker at the restart undercounts nothing.
func walRegression(crashes []walCrash, got []Delivery) int {
	n := 0
	for _, c := range crashes {
		seen := map[int64]bool{}
		for _, d := range got {
			if seen[d.OutboxID] || !d.ReadAt.Before(c.struck) {
				continue
			}
			seen[d.OutboxID] = true
			if lsn, err := pglogrepl.ParseLSN(d.CommitLSN); c.noSlot || (err == nil && lsn >= c.restored) {
				n++
			}
		}
	}
	return n
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
