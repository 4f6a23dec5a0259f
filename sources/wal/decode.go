package wal

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Decoding pgoutput: a transaction's BEGIN, RELATION, INSERT and COMMIT
// messages become outbox rows and their messages, and move the position
// read between transactions.

func (st *streamSession) decode(ctx context.Context, walData []byte) error {
	m, err := pglogrepl.Parse(walData)
	if err != nil {
		return fmt.Errorf("decode pgoutput message: %w", err)
	}
	return st.apply(ctx, m)
}

// apply takes one decoded pgoutput message: the session's own, or one a
// shared stream decoded once and routed to this member.
func (st *streamSession) apply(ctx context.Context, m pglogrepl.Message) error {
	s := st.s
	if st.beyond {
		return nil
	}
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		if s.until != 0 && m.FinalLSN >= s.until {
			st.beyond = true // the shared stream's (migrate.go)
			return nil
		}
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
