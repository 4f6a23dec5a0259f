package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// The shared stream (slot_mode: shared): the wal pipelines of a process on
// one database — same host, port, database, user and password, and the
// same slot and publication names — read one slot through one walsender.
// Each wal pipeline of its own costs a slot (max_replication_slots), a
// walsender (max_wal_senders), WAL retained for it alone, and a status
// update every status_interval even when idle. The shared stream decodes
// each message once and routes an INSERT to the members whose outbox table
// it is in; BEGIN, COMMIT, keepalives and heartbeats go to every member, so
// each member keeps the progress a stream of its own would (its window,
// what it may confirm).
//
// The slot is confirmed to the lowest position every member delivered, and
// each member's own position is kept in the members table (sharedstate.go),
// so a member resumes where it left off, whatever the others did. A member
// that stops or is paused keeps its row: the slot holds the WAL it still
// needs, without bound, and the watcher says so (shared.go's watch, the
// member's health and ferry_wal_shared_member_behind_bytes). Nothing is
// ever released that a member did not deliver.
//
// A member whose window stays full for sharedStallLimit is detached instead
// of holding every other member up: it drains on its own, and rejoins from
// its position; the stream then restarts from there (START_REPLICATION
// cannot go back on a running stream), and the members that were further
// skip the transactions they already read.

// sharedStallLimit is how long the stream waits for room in one member's
// window before it detaches that member.
const sharedStallLimit = 5 * time.Second

// sharedAskAfter is how long the stream stays silent before it asks the
// server for a reply (a dead connection answers nothing); an idle server
// sends a keepalive every wal_sender_timeout/2 anyway.
const sharedAskAfter = 20 * time.Second

// errStalled detaches a member whose window stayed full.
var errStalled = errors.New("the pipeline's window stayed full; it reads on its own until it has room again")

// sharedStreams holds the process's shared streams by key.
var sharedStreams = struct {
	sync.Mutex
	m map[string]*sharedStream
}{m: map[string]*sharedStream{}}

// sharedStream is one shared slot's stream. The run goroutine owns the
// replication connection and the fields marked so; joins and leaves are
// handed over through mu.
type sharedStream struct {
	key               string
	slotKey           string // host, port, database and slot: the server's slot
	user              string
	tenant            string // every member's: a shared slot is one tenant's
	slot, publication string
	cfg               *Config // the first member's: dsn and intervals
	log               *slog.Logger
	slots             *slotManager

	refs int // members holding the stream; guarded by sharedStreams

	joinMu   sync.Mutex // serializes joins' DDL
	prepared bool       // guarded by joinMu
	pool     *pgxpool.Pool

	mu      sync.Mutex
	pending []*member
	leaving []*member
	all     map[*member]struct{} // joined and not left: for the watcher
	conn    *pgconn.PgConn
	wake    chan struct{} // signalled by wakeLocked, for the waits between sessions
	started bool
	stop    context.CancelFunc
	done    chan struct{}
	failed  chan struct{}
	failure error

	// Owned by the run goroutine.
	members   map[*member]struct{}
	byTable   map[string][]*member
	relations map[uint32]*pglogrepl.RelationMessage
	readEnd   pglogrepl.LSN // every transaction that committed before it was read
	confirmed pglogrepl.LSN
	inTx      bool
	heard     time.Time
	asked     time.Time
	// persistFailing: the members table cannot be written (logged once).
	persistFailing bool

	// Owned by the watcher: why splitting a member failed, by pipeline
	// (logged once per cause).
	splitErrs map[string]string
}

// member is a pipeline's part in a shared stream.
type member struct {
	src   *Source
	ctx   context.Context // the pipeline's: admit stops waiting when it ends
	table string          // schema.name

	// Guarded by the stream's mu: attached between its admission by the run
	// goroutine and its detachment, which sends the reason on out.
	attached bool
	out      chan error

	// Owned by the run goroutine while attached.
	st        *streamSession
	skip      bool          // the transaction being read committed before the member's readEnd
	persisted pglogrepl.LSN // its row's position
	backfill  atomic.Bool   // a backfill request waits (set by the checker)
}

// acquireShared returns the process's shared stream for cfg, creating it.
// Release it with release.
func acquireShared(cfg *Config, env plugins.Env, slot, publication string) (*sharedStream, error) {
	pc, err := pgx.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fatalf("source.dsn: %w", err)
	}
	// The tenant is part of the key: a stream connects with its first
	// member's dsn and runs with its settings, so it never carries two
	// tenants' pipelines (the tenant policy keeps their slot names apart
	// too; this holds for an admin's pipeline naming a tenant's slot).
	key := pgsource.DatabaseKey(pc) + "\x00" + slot + "\x00" + publication + "\x00" + env.Tenant
	slotKey := fmt.Sprintf("%s\x00%d\x00%s\x00%s", pc.Host, pc.Port, pc.Database, slot)
	sharedStreams.Lock()
	defer sharedStreams.Unlock()
	h := sharedStreams.m[key]
	if h == nil {
		if err := slotTaken(slotKey, key, pc.User, env.Tenant, slot); err != nil {
			return nil, err
		}
		base := env.ProcessLogger
		if base == nil {
			base = env.Logger
		}
		// The stream's lines are every member's: no pipeline attribute.
		log := base.With("source", Name, "shared_slot", slot)
		h = &sharedStream{key: key, slotKey: slotKey, user: pc.User, tenant: env.Tenant, slot: slot, publication: publication, cfg: cfg, log: log,
			slots: newSlotManager(cfg, env, log, slot, publication), all: map[*member]struct{}{}, splitErrs: map[string]string{},
			done: make(chan struct{}), failed: make(chan struct{}), members: map[*member]struct{}{}, wake: make(chan struct{}, 1)}
		sharedStreams.m[key] = h
	} else if diff := streamSettingsDiffer(h.cfg, cfg); len(diff) > 0 {
		env.Logger.Warn("this pipeline's settings of the shared stream differ from those it runs with (the first member's); give every member the same",
			"source", Name, "shared_slot", slot, "ignored", strings.Join(diff, ", "))
	}
	h.refs++
	return h, nil
}

// slotTaken refuses a second stream of one slot in the process: pipelines
// whose dsn differs (user, password, TLS or parameters) are separate
// streams, since a stream connects with its first member's credentials,
// yet by default they name the same slot, and a slot streams to one
// connection at a time. The pipeline waits (acquireLoop) rather than
// fails: a password rotated by a reload restarts the members one by one,
// and the first to move finds the others on the old dsn a moment longer.
// Guarded by sharedStreams.
func slotTaken(slotKey, key, user, tenant, slot string) error {
	for _, o := range sharedStreams.m {
		if o.slotKey != slotKey || o.key == key {
			continue
		}
		if o.tenant != tenant {
			return &slotTakenError{slot: slot, otherTenant: true}
		}
		// Neither the stream's user nor its password is named: the other
		// pipelines may be another tenant's.
		differs := "its password, TLS or connection parameters"
		if o.user != user {
			differs = "its user"
		}
		return &slotTakenError{slot: slot, differs: differs}
	}
	return nil
}

// slotTakenError: the slot is streamed in this process with another dsn,
// or by another tenant's pipelines (named neither).
type slotTakenError struct {
	slot, differs string
	otherTenant   bool
}

func (e *slotTakenError) Error() string {
	if e.otherTenant {
		return fmt.Sprintf("the shared slot %s is streamed in this process by another tenant's pipelines, and a shared slot is never "+
			"shared between tenants. Give this pipeline a shared slot of its own (slot: <name> and publication: <name>, with "+
			"slot_mode: shared), or slot_mode: own; it waits until the others have gone", e.slot)
	}
	return fmt.Sprintf("the shared slot %s is streamed in this process by pipelines whose source.dsn differs from this one's in %s; "+
		"a slot streams to one connection, so pipelines sharing it need the same dsn. Give this pipeline the same dsn, "+
		"or a shared slot of its own (slot: <name>, with slot_mode: shared), or slot_mode: own; it waits until the others have gone",
		e.slot, e.differs)
}

// acquireLoop acquires the pipeline's shared stream, waiting with backoff
// while its slot is streamed with another dsn (slotTaken); nil when ctx
// ended.
func (s *Source) acquireLoop(ctx context.Context) (*sharedStream, error) {
	bo := retry.Backoff()
	for {
		h, err := acquireShared(s.cfg, s.env, s.slots.slot, s.slots.publication)
		var taken *slotTakenError
		if !errors.As(err, &taken) {
			return h, err
		}
		d := bo.NextBackOff()
		s.env.Report.Failing(fmt.Errorf("wal source: %w", err), d)
		s.log.Error("wal source cannot join the shared slot; retrying", "err", err, "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(d):
		}
	}
}

// streamSettingsDiffer names the settings of the stream (the first
// member's, which it runs with) that b sets otherwise, as "key: b's (used:
// a's)".
func streamSettingsDiffer(a, b *Config) []string {
	var out []string
	add := func(key string, used, given any) {
		if used != given {
			out = append(out, fmt.Sprintf("%s: %v (used: %v)", key, given, used))
		}
	}
	add("status_interval", a.StatusInterval, b.StatusInterval)
	add("metrics_interval", a.MetricsInterval, b.MetricsInterval)
	add("heartbeat_interval", a.HeartbeatInterval, b.HeartbeatInterval)
	add("split_after_bytes", a.SplitAfterBytes, b.SplitAfterBytes)
	return out
}

// release drops a member's hold; the last one stops the stream.
func (h *sharedStream) release() {
	sharedStreams.Lock()
	h.refs--
	last := h.refs == 0
	if last {
		delete(sharedStreams.m, h.key)
	}
	sharedStreams.Unlock()
	if !last {
		return
	}
	h.mu.Lock()
	started := h.started
	if started {
		h.stop()
	}
	h.mu.Unlock()
	if started {
		<-h.done
	}
	if h.pool != nil {
		h.pool.Close()
	}
}

// join prepares the member (its table in the publication, its row) and
// hands it to the run goroutine, which starts streaming it at the next
// transaction boundary.
func (h *sharedStream) join(ctx context.Context, m *member) error {
	h.mu.Lock()
	h.all[m] = struct{}{} // running, even before its row exists: the watcher must not call it stopped
	h.mu.Unlock()
	s := m.src
	at, snapshot, err := h.registerMember(ctx, s)
	if err != nil {
		return err
	}
	switch {
	case snapshot:
		// Outside joinMu: a big table's snapshot must not hold up the
		// other members' joins.
		if at, err = s.sharedSnapshot(ctx, h); err != nil {
			return err
		}
	case !s.joinedAt:
		// A reset to a time (resetToTime): its rows go before the stream's,
		// as on a slot of its own. A rejoin has sent them already.
		if err := s.stream.sendReset(ctx); err != nil {
			return err
		}
	}
	s.joinedAt = true
	s.stream.startAt(at)
	m.table = s.stream.table.Schema + "." + s.stream.table.Name
	m.persisted = max(m.persisted, at)
	h.mu.Lock()
	defer h.mu.Unlock()
	m.out = make(chan error, 1)
	h.pending = append(h.pending, m)
	if !h.started {
		h.started = true
		runCtx, stop := context.WithCancel(context.Background())
		h.stop = stop
		go h.run(runCtx)
	}
	h.wakeLocked()
	return nil
}

// registerMember prepares the member's table and row (register), under
// joinMu. Only its first join in a run may read its initial snapshot: a
// rejoin (after a stall) has its snapshot's rows in its window already.
func (h *sharedStream) registerMember(ctx context.Context, s *Source) (at pglogrepl.LSN, snapshot bool, err error) {
	h.joinMu.Lock()
	defer h.joinMu.Unlock()
	if err := h.open(ctx); err != nil {
		return 0, false, err
	}
	s.pool, s.slots.pool, s.stream.pool, s.boot.pool = h.pool, h.pool, h.pool, h.pool
	if err := s.prepareTable(ctx); err != nil {
		return 0, false, err
	}
	return h.register(ctx, s.log, s.env.Pipeline, s.stream.table, s.cfg.InitialSnapshot && !s.joinedAt)
}

// open opens the stream's pool and prepares the database, once.
func (h *sharedStream) open(ctx context.Context) error {
	if h.pool == nil {
		pc, err := pgsource.PoolConfig(h.cfg.DSN, "shared:"+h.slot)
		if err != nil {
			return &fatal{err}
		}
		pc.MaxConns = 4 // the stream's statements, the watcher, the joins
		if h.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return err
		}
		h.slots.pool = h.pool
	}
	if h.prepared {
		return nil
	}
	if err := h.prepareShared(ctx); err != nil {
		return err
	}
	h.prepared = true
	return nil
}

// leave takes the member out of the stream and waits until the run
// goroutine no longer touches it.
func (h *sharedStream) leave(m *member) {
	h.mu.Lock()
	delete(h.all, m)
	for i, p := range h.pending {
		if p == m {
			h.pending = append(h.pending[:i], h.pending[i+1:]...)
			h.mu.Unlock()
			return
		}
	}
	if !m.attached {
		h.mu.Unlock()
		return
	}
	h.leaving = append(h.leaving, m)
	h.wakeLocked()
	h.mu.Unlock()
	select {
	case <-m.out:
	case <-h.done:
	}
}

// wakeLocked interrupts the run goroutine's read so it takes joins and
// leaves at once.
func (h *sharedStream) wakeLocked() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
	if h.conn != nil {
		_ = h.conn.Conn().SetReadDeadline(time.Now())
	}
}

// detach ends a member's part in the stream and tells it why (nil: it
// asked to leave).
func (h *sharedStream) detach(m *member, why error) {
	delete(h.members, m)
	h.mu.Lock()
	if m.attached {
		m.attached = false
		m.out <- why
	}
	h.mu.Unlock()
	h.indexTables()
}

// takeChanges admits the joined members and detaches the leaving ones,
// between transactions. It reports whether the stream must restart further
// back for a member that joined behind what was read.
func (h *sharedStream) takeChanges(conn *pgconn.PgConn) (rewind bool) {
	h.mu.Lock()
	joins, leaves := h.pending, h.leaving
	h.pending, h.leaving = nil, nil
	for _, m := range joins {
		// In the same critical section that takes it from pending: a leave
		// in between must find it either pending or attached.
		m.attached = true
	}
	h.mu.Unlock()
	for _, m := range leaves {
		h.detach(m, nil)
	}
	for _, m := range joins {
		h.members[m] = struct{}{}
		m.st = h.newSession(m, conn)
		if m.src.stream.readEnd < h.readEnd {
			rewind = true
		}
	}
	if len(joins)+len(leaves) > 0 {
		h.indexTables()
	}
	return rewind
}

func (h *sharedStream) newSession(m *member, conn *pgconn.PgConn) *streamSession {
	return &streamSession{s: m.src.stream, conn: conn, slot: h.slot, relations: map[uint32]*relation{}, hub: h,
		nextStatus: time.Now().Add(h.cfg.StatusInterval), heard: time.Now()}
}

func (h *sharedStream) indexTables() {
	h.byTable = map[string][]*member{}
	for m := range h.members {
		h.byTable[m.table] = append(h.byTable[m.table], m)
	}
}

// run streams, one session after another, until the last member releases
// the stream or it fails for good.
func (h *sharedStream) run(ctx context.Context) {
	defer close(h.done)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); h.watch(ctx) }()
	go func() { defer bg.Done(); h.checkBackfills(ctx) }()
	defer bg.Wait()
	if h.cfg.HeartbeatInterval > 0 {
		bg.Add(1)
		go func() { defer bg.Done(); h.heartbeat(ctx) }()
	}
	bo := retry.Backoff()
	for ctx.Err() == nil {
		err := h.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errSwitchSlot) {
			bo.Reset()
			continue
		}
		var f *fatal
		if errors.As(err, &f) {
			h.mu.Lock()
			h.failure = redact.Error(err)
			h.mu.Unlock()
			close(h.failed)
			return
		}
		if err == nil {
			err = errors.New("replication stream ended")
		}
		d := bo.NextBackOff()
		h.log.Error("shared wal stream cannot stream; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		for m := range h.members {
			m.src.env.Report.Failing(fmt.Errorf("wal source (shared slot %s): %w", h.slot, err), d)
		}
		h.waitBetweenSessions(ctx, time.After(d))
	}
}

// waitBetweenSessions waits for until (or ctx) while no session runs, and
// meanwhile takes joins and leaves: a stopping member must not wait out
// the backoff.
func (h *sharedStream) waitBetweenSessions(ctx context.Context, until <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-until:
			return
		case <-h.wake:
			h.takeChanges(nil)
		}
	}
}

// session streams the slot for the members from the lowest position any of
// them read, until ctx ends, the connection breaks, or a member joins
// behind what was read (errSwitchSlot: the next session starts there).
func (h *sharedStream) session(ctx context.Context) error {
	h.readEnd = 0
	h.takeChanges(nil)
	for len(h.members) == 0 {
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		}
		h.takeChanges(nil)
	}
	conn, err := connectReplication(ctx, h.cfg.DSN, "shared:"+h.slot)
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = conn.Close(closeCtx)
		cancel()
	}()
	start := pglogrepl.LSN(0)
	for m := range h.members {
		m.st, m.skip = h.newSession(m, conn), false
		if start == 0 || m.src.stream.readEnd < start {
			start = m.src.stream.readEnd
		}
	}
	h.readEnd, h.inTx, h.relations = start, false, map[uint32]*pglogrepl.RelationMessage{}
	args := []string{"proto_version '1'", "publication_names '" + h.publication + "'"}
	if h.slots.server.messages {
		args = append(args, "messages 'true'")
	}
	if err := pglogrepl.StartReplication(ctx, conn, h.slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return h.slots.startError(ctx, h.slot, err, h.confirmed)
	}
	h.slots.streaming(h.slot)
	h.mu.Lock()
	h.conn = conn
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.conn = nil
		h.mu.Unlock()
	}()
	for m := range h.members {
		m.src.env.Report.Recovered()
	}
	h.log.Info("shared wal stream streaming", "publication", h.publication, "members", len(h.members), "from", start.String())
	err = h.stream(ctx, conn)
	if errors.Is(err, errPresumedDead) {
		h.slots.terminate(conn.PID())
	}
	return err
}
