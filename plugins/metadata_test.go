package plugins_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// sourceMessage is a message as a source that keeps the contract emits it.
func sourceMessage() *message.Message {
	m := message.NewMessage("0b6f8d9e-2a49-4d1c-9a55-6c1f0e7d3a10", []byte(`{"id":7}`))
	m.Metadata = message.Metadata{
		plugins.MetaAggregateType: "order",
		plugins.MetaAggregateID:   "order-7",
		plugins.MetaEventType:     "OrderPlaced",
		plugins.MetaCreatedAt:     "2026-03-01T12:00:00.000001Z",
		plugins.MetaReadAt:        "2026-03-01T12:00:00.250000Z",
		plugins.MetaOutboxID:      "7",
		plugins.MetaPosition:      "812/7",
		plugins.MetaDBReadAt:      "1772366400250000000",
	}
	return m
}

func TestCheckSourceMetadata(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(m *message.Message)
		// want lists the problems, as "path: message" prefixes, in order.
		want []string
	}{
		{"keeps the contract", func(*message.Message) {}, nil},
		{"commit time and no database read time", func(m *message.Message) {
			delete(m.Metadata, plugins.MetaDBReadAt)
			m.Metadata.Set(plugins.MetaCommitAt, "1772366400000001000")
		}, nil},
		{"empty aggregate id (a NULL column)", func(m *message.Message) { m.Metadata.Set(plugins.MetaAggregateID, "") }, nil},
		{"ordering key by another name", func(m *message.Message) {
			delete(m.Metadata, plugins.MetaAggregateID)
			m.Metadata.Set(plugins.MetaKey, "partition-3")
		}, nil},
		{"no uuid", func(m *message.Message) { m.UUID = "" }, []string{"the message has no UUID"}},
		{"no read_at", func(m *message.Message) { delete(m.Metadata, plugins.MetaReadAt) },
			[]string{"read_at: not set: the read_to_ack lag"}},
		{"read_at not a time", func(m *message.Message) { m.Metadata.Set(plugins.MetaReadAt, "yesterday") },
			[]string{`read_at: "yesterday" is not an RFC 3339 time`}},
		{"created_at empty", func(m *message.Message) { m.Metadata.Set(plugins.MetaCreatedAt, "") },
			[]string{"created_at: not set"}},
		{"created_at without zone", func(m *message.Message) { m.Metadata.Set(plugins.MetaCreatedAt, "2026-03-01 12:00:00") },
			[]string{`created_at: "2026-03-01 12:00:00" is not an RFC 3339 time`}},
		{"database read time in seconds", func(m *message.Message) { m.Metadata.Set(plugins.MetaDBReadAt, "1772366400.25") },
			[]string{`ferry_db_read_at: "1772366400.25" is not Unix nanoseconds`}},
		{"commit time as a time", func(m *message.Message) { m.Metadata.Set(plugins.MetaCommitAt, "2026-03-01T12:00:00Z") },
			[]string{`ferry_commit_at: "2026-03-01T12:00:00Z" is not Unix nanoseconds`}},
		{"no position", func(m *message.Message) { delete(m.Metadata, plugins.MetaPosition) },
			[]string{"position: not set"}},
		{"no outbox id", func(m *message.Message) { delete(m.Metadata, plugins.MetaOutboxID) },
			[]string{"outbox_id: not set"}},
		{"no aggregate id nor key", func(m *message.Message) { delete(m.Metadata, plugins.MetaAggregateID) },
			[]string{"aggregate_id: not set (nor ferry_key)"}},
		{"no routing keys", func(m *message.Message) {
			delete(m.Metadata, plugins.MetaAggregateType)
			delete(m.Metadata, plugins.MetaEventType)
		}, []string{"aggregate_type: not set: routing", "event_type: not set: routing"}},
		{"every problem at once", func(m *message.Message) {
			m.UUID = ""
			m.Metadata = message.Metadata{plugins.MetaReadAt: "soon"}
		}, []string{"the message has no UUID", "position: not set", `read_at: "soon" is not`, "created_at: not set",
			"outbox_id: not set", "aggregate_id: not set", "aggregate_type: not set", "event_type: not set"}},
		{"undecodable row: position and reason suffice", func(m *message.Message) {
			m.Metadata = message.Metadata{plugins.MetaUndecodable: "outbox row at position 812/7 cannot be decoded", plugins.MetaPosition: "812/7"}
		}, nil},
		{"undecodable row without position", func(m *message.Message) {
			m.Metadata = message.Metadata{plugins.MetaUndecodable: "outbox row cannot be decoded"}
		}, []string{"position: not set"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := sourceMessage()
			tc.change(m)
			var got []string
			for _, e := range plugins.Flatten(plugins.CheckSourceMetadata(m)) {
				got = append(got, e.Error())
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), strings.Join(got, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %d: got %q, want it to start with %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// Each problem is a *FieldError naming the metadata key, so a caller can
// skip the ones a source is known not to keep.
func TestCheckSourceMetadataNamesKeys(t *testing.T) {
	m := sourceMessage()
	delete(m.Metadata, plugins.MetaAggregateType)
	delete(m.Metadata, plugins.MetaReadAt)
	var keys []string
	for _, e := range plugins.Flatten(plugins.CheckSourceMetadata(m)) {
		var fe *plugins.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v is a %T, not a *plugins.FieldError", e, e)
		}
		keys = append(keys, fe.Path)
	}
	if want := []string{plugins.MetaReadAt, plugins.MetaAggregateType}; !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	if err := plugins.CheckSourceMetadata(nil); err == nil {
		t.Fatal("a nil message passed")
	}
}
