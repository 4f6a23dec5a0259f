package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/window"
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
	key := pgsource.DatabaseKey(pc) + "\x00" + slot + "\x00" + publication
	sharedStreams.Lock()
	defer sharedStreams.Unlock()
	h := sharedStreams.m[key]
	if h == nil {
		log := env.Logger.With("source", Name, "shared_slot", slot)
		h = &sharedStream{key: key, slot: slot, publication: publication, cfg: cfg, log: log,
			slots: newSlotManager(cfg, env, log, slot, publication), all: map[*member]struct{}{},
			done: make(chan struct{}), failed: make(chan struct{}), members: map[*member]struct{}{}}
		sharedStreams.m[key] = h
	}
	h.refs++
	return h, nil
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
	h.joinMu.Lock()
	defer h.joinMu.Unlock()
	if err := h.open(ctx); err != nil {
		return err
	}
	s := m.src
	s.pool, s.slots.pool, s.stream.pool, s.boot.pool = h.pool, h.pool, h.pool, h.pool
	if err := s.prepareTable(ctx); err != nil {
		return err
	}
	at, err := h.register(ctx, s.log, s.env.Pipeline, s.stream.table)
	if err != nil {
		return err
	}
	s.stream.startAt(at)
	m.table = s.stream.table.Schema + "." + s.stream.table.Name
	m.persisted = max(m.persisted, at)
	h.mu.Lock()
	defer h.mu.Unlock()
	m.out = make(chan error, 1)
	h.pending = append(h.pending, m)
	h.all[m] = struct{}{}
	if !h.started {
		h.started = true
		runCtx, stop := context.WithCancel(context.Background())
		h.stop = stop
		go h.run(runCtx)
	}
	h.wakeLocked()
	return nil
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
	h.mu.Unlock()
	for _, m := range leaves {
		h.detach(m, nil)
	}
	for _, m := range joins {
		h.mu.Lock()
		m.attached = true
		h.mu.Unlock()
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
		select {
		case <-ctx.Done():
		case <-time.After(d):
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
		t := time.NewTimer(h.cfg.StatusInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
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
	return h.stream(ctx, conn)
}

// stream reads the session until it ends; see streamer.run, whose loop this
// follows, for the read deadlines.
func (h *sharedStream) stream(ctx context.Context, conn *pgconn.PgConn) error {
	netConn := conn.Conn()
	stopWake := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Now()) })
	defer stopWake()
	h.heard = time.Now()
	nextTick := time.Now()
	for {
		if ctx.Err() != nil {
			return h.finish(conn)
		}
		if !h.inTx {
			if h.takeChanges(conn) {
				_ = h.finish(conn)
				return errSwitchSlot
			}
			h.backfillSteps()
		}
		if !time.Now().Before(nextTick) {
			if err := h.progress(false); err != nil {
				return err
			}
			nextTick = time.Now().Add(h.cfg.StatusInterval)
		}
		_ = netConn.SetReadDeadline(nextTick)
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if !isTimeout(err) {
				return fmt.Errorf("replication stream: %w", err)
			}
			if err := h.checkSilence(); err != nil {
				return err
			}
			continue
		}
		h.heard = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := h.handle(msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

// checkSilence asks the server for a reply after sharedAskAfter without a
// message, and gives the connection up when even that goes unanswered.
func (h *sharedStream) checkSilence() error {
	silent := time.Since(h.heard)
	if silent > sharedAskAfter+serverSilence {
		return fmt.Errorf("replication stream: no message from the server for %s although a reply was requested; "+
			"the connection is presumed dead", silent.Round(time.Second))
	}
	if silent > sharedAskAfter && time.Since(h.asked) > sharedAskAfter {
		h.asked = time.Now()
		return h.sendStatus(true)
	}
	return nil
}

// handle takes one CopyData message: a keepalive, or WAL data decoded once
// and routed.
func (h *sharedStream) handle(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		if !h.inTx && ka.ServerWALEnd > h.readEnd {
			h.readEnd = ka.ServerWALEnd
			for m := range h.members {
				m.st.walEnd(ka.ServerWALEnd)
			}
		}
		if ka.ReplyRequested {
			return h.progress(true)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		msg, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("decode pgoutput message: %w", err)
		}
		h.route(msg, xld.ServerTime)
	}
	return nil
}

// route hands a decoded message to the members it concerns. A member's
// error detaches that member only.
func (h *sharedStream) route(msg pglogrepl.Message, serverTime time.Time) {
	switch msg := msg.(type) {
	case *pglogrepl.BeginMessage:
		h.inTx = true
		for m := range h.members {
			// Read before the member joined (the stream went back for
			// another member): the member has it already.
			m.skip = msg.FinalLSN < m.src.stream.readEnd
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
		}
	case *pglogrepl.RelationMessage:
		h.relations[msg.RelationID] = msg
		for _, m := range h.byTable[msg.Namespace+"."+msg.RelationName] {
			h.deliver(m, msg, serverTime)
		}
	case *pglogrepl.InsertMessage:
		rel := h.relations[msg.RelationID]
		if rel == nil {
			return
		}
		for _, m := range h.byTable[rel.Namespace+"."+rel.RelationName] {
			if m.skip {
				continue
			}
			if m.st.relations[msg.RelationID] == nil {
				h.deliver(m, rel, serverTime) // joined after the RELATION message
			}
			h.deliver(m, msg, serverTime)
		}
	case *pglogrepl.CommitMessage:
		h.inTx = false
		h.readEnd = max(h.readEnd, msg.TransactionEndLSN)
		for m := range h.members {
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
			m.skip = false
		}
	case *pglogrepl.LogicalDecodingMessage:
		if !msg.Transactional && !h.inTx && msg.LSN > h.readEnd {
			h.readEnd = msg.LSN
		}
		for m := range h.members {
			if !m.skip {
				h.deliver(m, msg, serverTime)
			}
		}
	}
}

// deliver applies msg to one member; a member that is stopping, stalled
// or cannot decode its table is detached, the others read on.
func (h *sharedStream) deliver(m *member, msg pglogrepl.Message, serverTime time.Time) {
	if _, ok := h.members[m]; !ok {
		return // detached earlier in this message's fan-out
	}
	m.st.serverTime = serverTime
	err := m.st.apply(m.ctx, msg)
	if err == nil {
		return
	}
	if m.ctx.Err() != nil {
		err = nil // stopping: leave asks for nothing else
	}
	h.detach(m, err)
}

// progress records what the members delivered: the window marks always
// (they free room), and, when a member's position moved, the positions
// in the members table and then the slot's — the lowest of every row.
// force sends a status update even when nothing moved (the server asked).
// A failed write is tried again at the next tick: the stream goes on.
func (h *sharedStream) progress(force bool) error {
	var pipelines, lsns []string
	var moved []*member
	var at []pglogrepl.LSN
	var marks []window.Mark
	low := pglogrepl.LSN(0)
	for m := range h.members {
		s := m.src.stream
		confirm, mark := s.deliverable()
		if low == 0 || confirm < low {
			low = confirm
		}
		if confirm > m.persisted {
			pipelines = append(pipelines, s.env.Pipeline)
			lsns = append(lsns, confirm.String())
			moved, at, marks = append(moved, m), append(at, confirm), append(marks, mark)
		} else {
			s.win.Recorded(mark)
		}
	}
	if len(moved) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		others, err := h.persist(ctx, pipelines, lsns)
		cancel()
		if err != nil {
			h.log.Warn("record the members' positions; will retry", "err", redact.Error(err))
			return h.maybeStatus(force, h.confirmed)
		}
		for i, m := range moved {
			m.persisted = at[i]
			m.src.stream.recorded(at[i], marks[i])
		}
		if others != 0 {
			low = min(low, others)
		}
		return h.maybeStatus(force, max(h.confirmed, low))
	}
	return h.maybeStatus(force, h.confirmed)
}

// maybeStatus sends a status update when the slot's position moved or
// force says so.
func (h *sharedStream) maybeStatus(force bool, confirm pglogrepl.LSN) error {
	if confirm == h.confirmed && !force {
		return nil
	}
	h.confirmed = confirm
	return h.sendStatus(false)
}

func (h *sharedStream) sendStatus(ask bool) error {
	h.mu.Lock()
	conn := h.conn
	h.mu.Unlock()
	if conn == nil {
		return nil
	}
	confirm := h.confirmed
	write := max(h.readEnd, confirm)
	if confirm == 0 {
		write = 0 // pglogrepl would confirm the write position instead
	}
	if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: confirm, WALApplyPosition: confirm, ReplyRequested: ask}); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	return nil
}

// finish ends a session in order: it records what the members delivered
// and ends the stream, so the server processed the confirmation before the
// connection closes. The members drain their windows on their own.
func (h *sharedStream) finish(conn *pgconn.PgConn) error {
	if err := h.progress(true); err != nil {
		h.log.Error("confirm progress at the end of the shared stream", "err", redact.Error(err))
		return nil
	}
	_ = conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), conn); err != nil {
		h.log.Debug("end replication stream", "err", redact.Error(err))
	}
	return nil
}

// backfillSteps runs the backfill step of the members with a backfill
// request (the checker found one) or one under way, between transactions.
func (h *sharedStream) backfillSteps() {
	for m := range h.members {
		s := m.src.stream
		woken := m.backfill.Swap(false)
		if woken && s.backfill != nil {
			s.backfill.Wake()
		}
		if !woken && (s.backfill == nil || !s.backfill.Busy()) {
			continue
		}
		if err := m.st.backfillStep(m.ctx); err != nil && m.ctx.Err() == nil {
			h.detach(m, err)
		}
	}
}
