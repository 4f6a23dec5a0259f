package outbox_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// FuzzMessage turns arbitrary row values into a message: it must never
// panic, must keep the payload byte for byte, must carry the row's
// identity, and must be the message the plain reference builds; a headers
// column that is not a JSON object is reported, not fatal.
func FuzzMessage(f *testing.F) {
	f.Add(int64(1), "order", "o-1", "Placed", []byte(`{"a":1}`), `{"traceparent":"00-1"}`, "")
	f.Add(int64(-5), "", "", "", []byte(nil), `null`, "e-1")
	f.Add(int64(7), "o", "x", "T", []byte("\xff\xfe not utf8"), `[1,2]`, "")
	f.Add(int64(9), "o", "x", "T", []byte(`{}`), `{"n": 1, "s": "v", "o": {"x": [1]}}`, "")
	f.Add(int64(3), "o", "x", "T", []byte(`{}`), `{"bad`, "")
	f.Fuzz(func(t *testing.T, id int64, aggType, aggID, typ string, payload []byte, headers, eventID string) {
		r := &outbox.Row{ID: id, Payload: payload, CreatedAt: time.Unix(1700000000, 0),
			AggregateType: pgtype.Text{String: aggType, Valid: true}, AggregateID: pgtype.Text{String: aggID, Valid: true},
			Type: pgtype.Text{String: typ, Valid: true}, Headers: pgtype.Text{String: headers, Valid: headers != ""},
			EventID: pgtype.Text{String: eventID, Valid: eventID != ""}}
		table, readAt := outbox.Table{Database: "db", Schema: "public", Name: "outbox"}, time.Now()
		m := table.Message(r, "1", readAt)
		sameMessage(t, m, referenceMessage(table, r, "1", readAt))
		if string(m.Payload) != string(payload) {
			t.Fatalf("payload changed: %q → %q", payload, m.Payload)
		}
		if m.UUID == "" || (eventID != "" && m.UUID != eventID) {
			t.Fatalf("event id %q (column %q)", m.UUID, eventID)
		}
		if m.Metadata.Get(plugins.MetaAggregateID) != aggID || m.Metadata.Get(plugins.MetaEventType) != typ {
			t.Fatalf("metadata %v", m.Metadata)
		}
		if h := m.Metadata.Get(outbox.MetaHeadersError); h != "" && !strings.Contains(h, "not a JSON object") {
			t.Fatalf("headers error %q", h)
		}
		if utf8.ValidString(aggID) && strings.ContainsRune(aggID, 0) {
			return
		}
		_ = r.Key()
	})
}
