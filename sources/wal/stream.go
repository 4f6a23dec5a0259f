package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/window"
)

// streamer owns what is read from the slot, across sessions: the window of
// events in flight, how far the stream was read, and which LSN may be
// confirmed to the server. Its fields are owned by the run goroutine (and,
// during the initial snapshot, by the snapshot reader while the run
// goroutine waits for it), except confirmed (atomic) and pending (its own
// lock), which the slot watcher and the API read.
type streamer struct {
	cfg   *Config
	env   plugins.Env
	log   *slog.Logger
	slots *slotManager  // to promote the initial snapshot's slot
	pool  *pgxpool.Pool // the source's, set once it is open (heartbeats)
	win   *window.Window[Position]
	// recordAt is how many acked-but-unconfirmed events make the source send
	// a status update at once instead of at the next tick.
	recordAt int

	table   outbox.Table
	layout  outbox.Layout // the mapped columns' types, from the start-up check
	typeMap *pgtype.Map

	admitted  uint64        // messages admitted since creation; window Marks count the same way
	readEnd   pglogrepl.LSN // every transaction that committed before it was read and admitted
	tail      confirmPoint  // an LSN confirmable once the first tail.count admitted messages are acked
	promote   *promotion    // the initial snapshot's slot, until its rows are acked and it is promoted
	skip      *keySet       // ids the initial snapshot delivered that the stream may send again
	skipUntil pglogrepl.LSN // ... in transactions committed up to here

	confirmed atomic.Uint64 // the LSN last confirmed to the server
	pending   pendingTxs

	// Backfills beside the stream, and resets to a time sent before it;
	// owned by the run goroutine (sessions and their streams). See backfill.go.
	backfill *backfill.Runner
	reset    *backfill.Runner
}

func newStreamer(cfg *Config, env plugins.Env, log *slog.Logger, slots *slotManager) *streamer {
	return &streamer{cfg: cfg, env: env, log: log, slots: slots,
		win:      window.New[Position](window.Config{MaxInFlight: env.MaxInFlight}),
		recordAt: max(1, env.MaxInFlight/2), typeMap: pgtype.NewMap()}
}

// confirmPoint is an LSN that may be confirmed once the first count admitted
// messages were acked: a commit or keepalive seen between transactions.
type confirmPoint struct {
	count uint64
	lsn   pglogrepl.LSN
}

// startAt is where a slot's stream begins: its confirmed position, or a new
// slot's consistent point. Both go forward only.
func (s *streamer) startAt(lsn pglogrepl.LSN) {
	s.advanceConfirmed(lsn)
	s.readEnd = max(s.readEnd, lsn)
}

// confirmedLSN is the LSN last confirmed to the server.
func (s *streamer) confirmedLSN() pglogrepl.LSN { return pglogrepl.LSN(s.confirmed.Load()) }

// advanceConfirmed raises the confirmed LSN (it never goes back).
func (s *streamer) advanceConfirmed(lsn pglogrepl.LSN) {
	for {
		cur := s.confirmed.Load()
		if uint64(lsn) <= cur || s.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// pendingTxs holds the commit LSN and time of each transaction whose events
// were read and not confirmed yet, oldest first (at most one per event in
// the window): the oldest undelivered event's age is measured from it. Safe
// for concurrent use.
type pendingTxs struct {
	mu  sync.Mutex
	txs []pendingTx
}

type pendingTx struct {
	commitLSN  pglogrepl.LSN
	commitTime time.Time
}

// note records a transaction whose first event was read.
func (p *pendingTxs) note(commit pglogrepl.LSN, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.txs); n > 0 && p.txs[n-1].commitLSN >= commit {
		return // read again after a reconnect
	}
	p.txs = append(p.txs, pendingTx{commit, at})
}

// confirmedTo drops the transactions the slot was confirmed past.
func (p *pendingTxs) confirmedTo(confirmed pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := 0
	for i < len(p.txs) && p.txs[i].commitLSN < confirmed {
		i++
	}
	if i > 0 {
		p.txs = append(p.txs[:0], p.txs[i:]...)
	}
}

// oldest is the commit time of the oldest transaction read and not
// confirmed, or zero.
func (p *pendingTxs) oldest() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.txs) == 0 {
		return time.Time{}
	}
	return p.txs[0].commitTime
}

// start sends START_REPLICATION for slot on conn.
func (s *streamer) start(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	args := []string{"proto_version '1'", "publication_names '" + s.slots.publication + "'"}
	if s.slots.server.messages {
		args = append(args, "messages 'true'")
	}
	// Starting at readEnd, not at the slot's confirmed LSN: after a dropped
	// connection the window still holds what was read, so the server skips
	// the transactions that committed before it instead of sending them twice.
	return pglogrepl.StartReplication(ctx, conn, slot, s.readEnd, pglogrepl.StartReplicationOptions{PluginArgs: args})
}

// streamSession is one START_REPLICATION session. A single goroutine owns the
// connection: it reads, admits, and sends every status update, because a
// pgconn.PgConn is not safe for concurrent use.
//
// Backpressure: when the window is full, admit stops reading the socket (the
// server then blocks writing to it, so memory stays bounded however large the
// transaction) but keeps sending status updates on the timer and whenever the
// acked prefix moves. The server's wal_sender_timeout counts from the last
// message it received from us, and a walsender blocked on a full socket still
// reads our replies, so the connection survives a stall of any length.
type streamSession struct {
	s          *streamer
	conn       *pgconn.PgConn
	slot       string
	relations  map[uint32]*relation
	nextStatus time.Time

	// The transaction being read: pgoutput sends a transaction only once it
	// committed, so BEGIN already carries the commit LSN and time.
	inTx       bool
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	prevEnd    pglogrepl.LSN // end of the transaction before this one
	ordinal    int
	// serverTime is the server's clock when it sent the message being
	// decoded: the database-clock read time of the commit→read lag.
	serverTime time.Time
	// held is the transaction's latest event, admitted only when the next
	// event or the COMMIT arrives: then it is known whether it is the last
	// one, and so whether acking it completes the transaction (see Position).
	held *heldEvent
	// heard is when the server last sent anything (or when the stream last
	// started listening); asked is when a reply was last requested. See
	// serverSilence.
	heard, asked time.Time
}

// A connection that died without an error — a half-open TCP connection
// after a network partition, a NAT or firewall that forgot it, a frozen
// proxy — reads nothing and writes into a void: status updates "succeed"
// and the stream waits for ever. So after askAfter without a message the
// next status update asks the server to reply at once, and serverSilence
// without any message (while the stream was reading) ends the session;
// the source reconnects. PostgreSQL answers a request within a round trip
// even while it decodes (it checks for replies between changes), and its
// own replicas give up after wal_receiver_timeout (60s) the same way.
const (
	askAfter      = 5 * time.Second
	serverSilence = 30 * time.Second
)

type heldEvent struct {
	key string
	pos Position
	msg *message.Message
}

// run streams slot on conn (started) until ctx ends — then it drains and
// confirms — or the session breaks.
func (s *streamer) run(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	st := &streamSession{s: s, conn: conn, slot: slot, relations: map[uint32]*relation{},
		nextStatus: time.Now().Add(s.cfg.StatusInterval), heard: time.Now()}
	netConn := conn.Conn()
	// A cancelled ctx interrupts a blocking read through its deadline; the
	// read loop then finds ctx done and shuts down in order.
	stopWake := context.AfterFunc(ctx, func() { _ = netConn.SetReadDeadline(time.Now()) })
	defer stopWake()

	var deadline time.Time
	for {
		if ctx.Err() != nil {
			return st.finish()
		}
		if !time.Now().Before(st.nextStatus) || s.win.Unrecorded() >= s.recordAt {
			if err := st.sendStatus(); err != nil {
				return err
			}
		}
		if !st.inTx && s.promote != nil {
			if _, mark, _ := s.win.Prefix(); uint64(mark) >= s.promote.count {
				if err := st.promote(ctx); err != nil {
					return err
				}
			}
		}
		if !st.inTx {
			if err := st.backfillStep(ctx); err != nil {
				return err
			}
		}
		if !deadline.Equal(st.nextStatus) {
			deadline = st.nextStatus
			_ = netConn.SetReadDeadline(deadline)
		}
		if ctx.Err() != nil { // cancelled before the deadline was set: do not block
			continue
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if isTimeout(err) {
				if silent := time.Since(st.heard); silent > max(serverSilence, 3*s.cfg.StatusInterval) && ctx.Err() == nil {
					return fmt.Errorf("replication stream: no message from the server for %s although a reply was requested; "+
						"the connection is presumed dead", silent.Round(time.Second))
				}
				deadline = time.Time{}
				continue
			}
			return fmt.Errorf("replication stream: %w", err)
		}
		st.heard = time.Now()
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := st.handle(ctx, msg.Data); err != nil {
				if ctx.Err() != nil {
					// Stopped while admit waited for room: the connection is
					// fine, so confirm what was delivered before leaving.
					return st.finish()
				}
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return pgconn.Timeout(err) || (errors.As(err, &ne) && ne.Timeout())
}

func (st *streamSession) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	s := st.s
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return err
		}
		// Between transactions, everything the server sent before its WAL
		// end was read: once the window has delivered it, the slot may be
		// confirmed up to there. This is what lets an idle database's slot
		// advance when other databases write WAL.
		if !st.inTx && ka.ServerWALEnd > s.readEnd {
			s.readEnd = ka.ServerWALEnd
			s.tail = confirmPoint{count: s.admitted, lsn: s.readEnd}
		}
		if ka.ReplyRequested {
			return st.sendStatus()
		}
		return nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return err
		}
		st.serverTime = xld.ServerTime
		return st.decode(ctx, xld.WALData)
	}
	return nil
}

func (st *streamSession) decode(ctx context.Context, walData []byte) error {
	s := st.s
	m, err := pglogrepl.Parse(walData)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		st.inTx, st.commitLSN, st.commitTime, st.ordinal = true, m.FinalLSN, m.CommitTime, 0
		st.prevEnd = s.readEnd
	case *pglogrepl.RelationMessage:
		rel, err := s.mapRelation(m)
		if err != nil {
			return err
		}
		st.relations[m.RelationID] = rel
	case *pglogrepl.InsertMessage:
		rel := st.relations[m.RelationID]
		if rel == nil || !rel.outbox {
			return nil // another table of a shared publication
		}
		return st.insert(ctx, rel, m.Tuple)
	case *pglogrepl.CommitMessage:
		if st.held != nil {
			st.held.pos.Confirm = m.TransactionEndLSN
			if err := st.admitHeld(ctx); err != nil {
				return err
			}
		}
		st.inTx = false
		s.readEnd = max(s.readEnd, m.TransactionEndLSN)
		s.tail = confirmPoint{count: s.admitted, lsn: s.readEnd}
	case *pglogrepl.LogicalDecodingMessage:
		// A heartbeat (ours or another pipeline's): outside a transaction it
		// is a point the slot may be confirmed to once the window is empty.
		if !m.Transactional && !st.inTx && m.LSN > s.readEnd {
			s.readEnd = m.LSN
			s.tail = confirmPoint{count: s.admitted, lsn: s.readEnd}
		}
	}
	// UPDATE, DELETE and TRUNCATE are not events (and the publication Ferry
	// creates does not even send them): deleting outbox rows, in the same
	// transaction or later, changes nothing that was delivered.
	return nil
}

func (st *streamSession) insert(ctx context.Context, rel *relation, tuple *pglogrepl.TupleData) error {
	s := st.s
	row := s.decodeRow(rel, tuple)
	if s.skip != nil {
		// Rows an initial-snapshot pass already delivered, committed just
		// after the slot's start: they are streamed again; skip them.
		if st.commitLSN > s.skipUntil {
			s.skip = nil
		} else if s.skip.has(rowKey(&row)) {
			return nil
		}
	}
	st.ordinal++
	if !row.RowID.Valid {
		// No id column: the row's place in the log identifies it, the same
		// at every re-send of its transaction.
		row.RowID = pgtype.Text{String: positionText(st.commitLSN, st.ordinal), Valid: true}
	}
	if st.ordinal == 1 {
		s.pending.note(st.commitLSN, st.commitTime)
	}
	row.DBReadAt = st.serverTime
	if row.CreatedAt.IsZero() {
		row.CreatedAt = st.commitTime // no created_at column
	}
	msg := s.streamedMessage(&row, st.commitLSN, st.ordinal, st.commitTime)
	if st.held != nil {
		// Not the transaction's last event: acking it completes only the
		// transactions before this one.
		st.held.pos.Confirm = st.prevEnd
		if err := st.admitHeld(ctx); err != nil {
			return err
		}
	}
	st.held = &heldEvent{key: row.Key(), pos: Position{CommitLSN: st.commitLSN}, msg: msg}
	return nil
}

// streamedMessage is the message of a row streamed in the transaction that
// commitLSN ends, the ordinal-th outbox row of it: the row's message plus
// the commit's LSN and time.
func (s *streamer) streamedMessage(row *outbox.Row, commitLSN pglogrepl.LSN, ordinal int, commitTime time.Time) *message.Message {
	// The commit's values are written into one buffer and become one
	// string: the position ("LSN/ordinal", see positionText), the LSN
	// (its prefix), and the commit time twice.
	var buf [96]byte
	b := appendLSN(buf[:0], commitLSN)
	lsnEnd := len(b)
	b = strconv.AppendInt(append(b, '/'), int64(ordinal), 10)
	posEnd := len(b)
	b = plugins.AppendTime(b, commitTime)
	timeEnd := len(b)
	b = strconv.AppendInt(b, commitTime.UnixNano(), 10)
	text := string(b)
	position := text[:posEnd]
	if commitLSN == 0 {
		position = positionText(0, ordinal)
	}
	msg := s.table.Message(row, position, time.Now())
	msg.Metadata[MetaCommitLSN] = text[:lsnEnd]
	msg.Metadata[MetaCommittedAt] = text[posEnd:timeEnd]
	msg.Metadata[plugins.MetaCommitAt] = text[timeEnd:]
	return msg
}

// appendLSN appends lsn.String(), "%X/%X" of its halves, without fmt.
func appendLSN(b []byte, lsn pglogrepl.LSN) []byte {
	start := len(b)
	b = strconv.AppendUint(b, uint64(lsn>>32), 16)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(uint32(lsn)), 16)
	for i := start; i < len(b); i++ {
		if c := b[i]; c >= 'a' && c <= 'f' {
			b[i] = c - 'a' + 'A'
		}
	}
	return b
}

func (st *streamSession) admitHeld(ctx context.Context) error {
	h := st.held
	st.held = nil
	return st.admit(ctx, h.key, h.pos, h.msg)
}

// admit adds one event to the window. While the window is full it does not
// read the socket, but it keeps the server informed: see streamSession.
func (st *streamSession) admit(ctx context.Context, key string, pos Position, msg *message.Message) error {
	s := st.s
	if s.win.Room() <= 0 {
		// The socket is not read while waiting: silence meanwhile says
		// nothing about the connection.
		defer func() { st.heard = time.Now() }()
		for s.win.Room() <= 0 {
			t := time.NewTimer(max(time.Until(st.nextStatus), 0))
			select {
			case <-s.win.Progressed():
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			if !time.Now().Before(st.nextStatus) || s.win.Unrecorded() >= s.recordAt {
				if err := st.sendStatus(); err != nil {
					return err
				}
			}
		}
	}
	if err := s.win.Admit(ctx, key, pos, msg); err != nil {
		return err
	}
	s.admitted++
	return nil
}

// sendStatus confirms what the window delivered: the Confirm LSN of the
// acked prefix's last event, or — when every event read so far was acked —
// the last commit, heartbeat or keepalive position read between transactions.
// Write is what was read, flush and apply what was delivered: the server
// keeps WAL from the flush position and a restart resumes there.
func (st *streamSession) sendStatus() error {
	s := st.s
	pos, mark, ok := s.win.Prefix()
	confirm := s.confirmedLSN()
	if ok && pos.Confirm > confirm {
		confirm = pos.Confirm
	}
	if uint64(mark) >= s.tail.count && s.tail.lsn > confirm {
		confirm = s.tail.lsn
	}
	write := max(s.readEnd, confirm)
	if confirm == 0 {
		// pglogrepl would replace a zero flush position with the write
		// position, confirming what was not delivered.
		write = 0
	}
	now := time.Now()
	ask := now.Sub(st.heard) > askAfter && now.Sub(st.asked) > askAfter
	if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: confirm, WALApplyPosition: confirm, ReplyRequested: ask}); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	if ask {
		st.asked = now
	}
	s.advanceConfirmed(confirm)
	s.pending.confirmedTo(confirm)
	// Confirmed to the server: these events will not be sent again after a
	// crash, except inside a transaction not yet complete, which the slot
	// can only re-send whole (the unconfirmed tail).
	s.win.Recorded(mark)
	st.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	return nil
}

// finish ends the session on shutdown: it lets dispatched events finish (up
// to the drain timeout), confirms what was acked and ends the stream so the
// server has processed the confirmation before the connection closes.
func (st *streamSession) finish() error {
	s := st.s
	s.log.Info("wal source stopping: waiting for in-flight events, then confirming what was delivered",
		"in_flight", s.win.Stats().Dispatched, "drain_timeout", pgsource.DrainTimeout(s.env))
	// Drain in status-interval steps: a drain timeout longer than the
	// server's wal_sender_timeout must not cost the connection (and with it
	// the final confirmation).
	deadline := time.Now().Add(pgsource.DrainTimeout(s.env))
	for {
		step := st.nextStatus
		if deadline.Before(step) {
			step = deadline
		}
		drainCtx, cancel := context.WithDeadline(context.Background(), step)
		err := s.win.Drain(drainCtx)
		cancel()
		if err == nil {
			break
		}
		if !time.Now().Before(deadline) {
			s.log.Warn("drain timed out; unacked events will be sent again on restart", "held", s.win.Stats().Held)
			break
		}
		if err := st.sendStatus(); err != nil {
			s.log.Error("confirm progress while draining", "err", redact.Error(err))
			return nil
		}
	}
	s.recordBackfill()
	if err := st.sendStatus(); err != nil {
		s.log.Error("confirm progress at shutdown", "err", redact.Error(err))
		return nil
	}
	_ = st.conn.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), st.conn); err != nil {
		s.log.Debug("end replication stream", "err", redact.Error(err))
	}
	s.log.Info("wal source stopped", "confirmed", s.confirmedLSN().String())
	return nil
}

// promote turns the initial snapshot's temporary slot into the permanent
// slot, now that every snapshot row was acked: a copy starts where the
// temporary slot was confirmed. Until now a crash dropped the temporary slot
// and the next start read the snapshot again; from now on the permanent slot
// holds the position.
func (st *streamSession) promote(ctx context.Context) error {
	s := st.s
	if err := st.sendStatus(); err != nil {
		return err
	}
	if err := s.slots.copyTo(ctx, st.slot); err != nil {
		// Keep streaming the temporary slot and try again at the next status
		// update rather than lose it (and re-read the snapshot).
		s.log.Warn("create the permanent replication slot; will retry", "err", redact.Error(err))
		return nil
	}
	s.promote = nil
	s.log.Info("created replication slot from the initial snapshot's slot", "confirmed", s.confirmedLSN().String())
	return errSwitchSlot
}

// relation maps a RELATION message's columns to the outbox fields.
type relation struct {
	outbox bool
	idx    [outbox.NumFields]int    // column index in the tuple; -1 when not mapped
	oid    [outbox.NumFields]uint32 // column type
	extra  []int                    // column index of each columns.extra entry
}

func (s *streamer) mapRelation(m *pglogrepl.RelationMessage) (*relation, error) {
	rel := &relation{outbox: m.Namespace == s.table.Schema && m.RelationName == s.table.Name}
	if !rel.outbox {
		return rel, nil
	}
	c := s.cfg.Columns
	for f, name := range c.Names() {
		rel.idx[f] = -1
		for i, col := range m.Columns {
			if name != "" && col.Name == name {
				rel.idx[f], rel.oid[f] = i, col.DataType
				if col.DataType == s.layout.Declared[f] && s.layout.OID[f] != 0 {
					// A domain arrives as its own type: decode its base
					// type. (A column altered since the start-up check
					// arrives as its new type and is decoded as such.)
					rel.oid[f] = s.layout.OID[f]
				}
			}
		}
		if name != "" && rel.idx[f] < 0 {
			return nil, missingColumn(m, name)
		}
	}
	for _, name := range c.Carried() {
		i := slices.IndexFunc(m.Columns, func(col *pglogrepl.RelationMessageColumn) bool { return col.Name == name })
		if i < 0 {
			return nil, missingColumn(m, name)
		}
		rel.extra = append(rel.extra, i)
	}
	return rel, nil
}

func missingColumn(m *pglogrepl.RelationMessage, name string) error {
	return fmt.Errorf("outbox table %s.%s has no column %q in the replication stream (check source.columns, and the publication's column list)",
		m.Namespace, m.RelationName, name)
}

// decodeRow turns a tuple's text values into an outbox row, the same way
// the initial snapshot reads one. A value that does not decode makes the
// row undecodable (a dead letter), never a stream error: an error here
// would end the session, and the slot would send the same row again and
// again.
func (s *streamer) decodeRow(rel *relation, tuple *pglogrepl.TupleData) outbox.Row {
	data := func(i int) ([]byte, bool) {
		if i < 0 || tuple == nil || i >= len(tuple.Columns) || tuple.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return nil, false
		}
		return tuple.Columns[i].Data, true
	}
	// The tuple is in the connection's buffer, which the next message
	// reuses: copy the values out, the short ones into one string (one
	// allocation, not one each; the message keeps them all) and the
	// payload on its own.
	size := 0
	for f, i := range rel.idx {
		if d, ok := data(i); ok && outbox.Field(f) != outbox.FieldPayload {
			size += len(d)
		}
	}
	for _, i := range rel.extra {
		d, _ := data(i)
		size += len(d)
	}
	var all strings.Builder
	all.Grow(size)
	var ends [outbox.NumFields]int
	for f, i := range rel.idx {
		if d, ok := data(i); ok && outbox.Field(f) != outbox.FieldPayload {
			all.Write(d)
		}
		ends[f] = all.Len()
	}
	extraEnds := make([]int, len(rel.extra))
	for k, i := range rel.extra {
		d, _ := data(i)
		all.Write(d)
		extraEnds[k] = all.Len()
	}
	text := all.String()
	var v [outbox.NumFields]outbox.Text
	var payload []byte
	start := 0
	for f, i := range rel.idx {
		d, ok := data(i)
		switch {
		case !ok:
		case outbox.Field(f) == outbox.FieldPayload:
			payload = append(make([]byte, 0, len(d)), d...)
			v[f].Valid = true
		default:
			v[f] = outbox.Text{String: text[start:ends[f]], Valid: true}
		}
		start = ends[f]
	}
	var extra []outbox.Text
	if len(rel.extra) > 0 {
		extra = make([]outbox.Text, len(rel.extra))
		for k, i := range rel.extra {
			_, ok := data(i)
			extra[k] = outbox.Text{String: text[start:extraEnds[k]], Valid: ok}
			start = extraEnds[k]
		}
	}
	return s.cfg.Columns.DecodePayload(s.typeMap, rel.oid, v, payload, extra)
}

// heartbeat writes a non-transactional logical decoding message to the
// source database every HeartbeatInterval. On a database nobody writes to,
// the server has nothing to send this slot even while other databases fill
// the WAL, and a client that confirms only what it receives never advances
// the slot; the heartbeat gives the stream a position in this database to
// confirm (and shows the path from WAL to Ferry works).
func (s *streamer) heartbeat(ctx context.Context) {
	t := time.NewTicker(s.cfg.HeartbeatInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := s.pool.Exec(qctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', $1)`, s.env.Pipeline)
		cancel()
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			s.log.Warn("write heartbeat; a quiet database's slot may not advance", "err", redact.Error(err))
			failing = true
		case err == nil && failing:
			s.log.Info("heartbeats written again")
			failing = false
		}
	}
}
