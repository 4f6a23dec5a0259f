package outbox_test

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// referenceMessage is Table.Message written the plain way — encoding/json
// for the headers, uuid.NewSHA1, time.Format — which the fast one must
// match byte for byte.
func referenceMessage(t outbox.Table, r *outbox.Row, position string, readAt time.Time) *message.Message {
	format := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }
	id := r.EventID.String
	if !r.EventID.Valid || id == "" {
		if u, err := uuid.Parse(r.RowID.String); r.RowID.Valid && err == nil && len(r.RowID.String) == 36 {
			id = u.String()
		} else {
			id = uuid.NewSHA1(uuid.MustParse("0b5c1f9e-6a44-5d0e-9c61-3f7a2d8e4b10"),
				[]byte(t.Database+"/"+t.Schema+"."+t.Name+"/"+r.IDText())).String()
		}
	}
	m := message.NewMessage(id, r.Payload)
	md := m.Metadata
	if raw := r.Headers.String; r.Headers.Valid && raw != "" && raw != "null" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &obj); err != nil {
			md[outbox.MetaHeadersError] = "headers column is not a JSON object: " + err.Error()
		}
		var reserved []string
		for k := range obj {
			if !plugins.IsInternal(k) && plugins.ReservedHeader(k) {
				reserved = append(reserved, k)
			}
		}
		if reserved != nil {
			slices.Sort(reserved)
			md[plugins.MetaReservedHeaders] = strings.Join(reserved, ",")
		}
		for k, v := range obj {
			if plugins.IsInternal(k) || plugins.ReservedHeader(k) {
				continue
			}
			var s string
			if json.Unmarshal(v, &s) == nil {
				md[k] = s
			} else {
				md[k] = string(v)
			}
		}
	}
	md[plugins.MetaAggregateType] = r.AggregateType.String
	md[plugins.MetaAggregateID] = r.AggregateID.String
	md[plugins.MetaEventType] = r.Type.String
	created := r.CreatedAt
	if created.IsZero() {
		created = r.DBReadAt
		if created.IsZero() {
			created = readAt
		}
	}
	md[plugins.MetaCreatedAt] = format(created)
	md[plugins.MetaReadAt] = format(readAt)
	md[plugins.MetaOutboxID] = r.IDText()
	md[plugins.MetaPosition] = position
	if !r.DBReadAt.IsZero() {
		md[plugins.MetaDBReadAt] = strconv.FormatInt(r.DBReadAt.UnixNano(), 10)
	}
	for i, name := range r.ExtraNames {
		if r.Extra[i].Valid {
			md[plugins.ColumnKey(name)] = r.Extra[i].String
		}
	}
	if r.AggregateVersion.Valid && r.AggregateVersionHeader != "" {
		md[r.AggregateVersionHeader] = r.AggregateVersion.String
	}
	return m
}

// sameMessage fails unless got and want have the same id, payload and
// metadata.
func sameMessage(t *testing.T, got, want *message.Message) {
	t.Helper()
	if got.UUID != want.UUID || string(got.Payload) != string(want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
		t.Fatalf("message differs from the reference:\n got  %s %q %q\n want %s %q %q",
			got.UUID, got.Payload, got.Metadata, want.UUID, want.Payload, want.Metadata)
	}
}

// headerCases are headers columns of every shape: the flat objects of
// strings the fast path reads, and everything it leaves to encoding/json.
var headerCases = []string{
	`{"tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
	`{"a":"1","b":"2","c":"3"}`, `{}`, ` { } `, "\t{\n\"a\" :\r\"b\" }\n", `{"":""}`,
	`{"n": 1, "f": -0.5e+10, "z": 0, "big": 123456789012345678901234567890, "e": 1E-3}`,
	`{"t": true, "f": false, "nil": null}`,
	`{"o": {"x": [1, {"y": "z"}]}, "a": [], "s": "v"}`,
	`{"esc": "a\"b\\c\/d\n\t\u00e9\ud83d\ude00"}`, `{"k\u0065y": "v"}`, `{"bad": "\ud800"}`,
	`{"ünï": "cödé ☃ 😀"}`, "{\"inv\": \"\xff\xfe\"}", "{\"k\xc3\": \"v\"}", "{\"ctl\": \"a\x01b\"}",
	`{"dup": "1", "dup": "2"}`, `{"dup": 1, "dup": "x"}`,
	`{"ferry_topic": "elsewhere", "ferry_final": "true", "ok": "yes"}`,
	`{"aggregate_id": "spoofed", "outbox_id": "x"}`,
	`{"ferry-aggregate-version": "9"}`,
	`null`, ` null`, `[1,2]`, `"str"`, `42`, `true`, `{"bad`, `{"a":}`, `{"a":1,}`, `{"a" 1}`, `{,}`,
	`{"a":1}x`, `{"a":1}{}`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":.5}`, `{"a":+1}`,
	`{"a":tru}`, `{"a":nul}`, `{"a":truex}`, `{"a":"b"`, `{"a"`, `{`, `{"a":"b",`, `{"a":NaN}`,
	`{'a': 'b'}`, `{a: "b"}`, "\ufeff{}", "{}\x00",
}

func TestMessageMatchesReference(t *testing.T) {
	table := outbox.Table{Database: "db", Schema: "public", Name: "outbox"}
	readAt := time.Date(2026, 12, 1, 14, 44, 45, 987654321, time.FixedZone("X", 3600))
	created := time.Date(2026, 12, 1, 14, 44, 45, 123456789, time.UTC)
	text := func(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }
	rows := []outbox.Row{
		{ID: 7, RowID: text("7"), CreatedAt: created, DBReadAt: created.Add(time.Second)},
		{ID: -3},
		{RowID: text("3f0c6b3e-2d1a-4f5e-9a7b-1c2d3e4f5a6b"), CreatedAt: time.Date(12345, 1, 1, 0, 0, 0, 0, time.UTC)},
		{RowID: text("3F0C6B3E-2D1A-4F5E-9A7B-1C2D3E4F5A6B"), DBReadAt: time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC)},
		{RowID: text("urn:uuid:3f0c6b3e-2d1a-4f5e-9a7b-1c2d3e4f5a6b"), EventID: text("evt-1")},
		{ID: 1 << 62, RowID: text(string(make([]byte, 200))), ExtraNames: []string{"tenant", "region"},
			Extra: []pgtype.Text{text("acme"), {}}, AggregateVersion: text("12"), AggregateVersionHeader: "v"},
	}
	for _, h := range headerCases {
		for _, r := range rows {
			r.AggregateType, r.AggregateID, r.Type, r.Payload = text("order"), text("o-1"), text("Placed"), []byte(`{"x":1}`)
			r.Headers = text(h)
			want := referenceMessage(table, &r, "1/2", readAt)
			got := table.Message(&r, "1/2", readAt)
			sameMessage(t, got, want)
		}
	}
}

// FuzzHeaders holds Table.Message to the reference on any headers column.
func FuzzHeaders(f *testing.F) {
	for _, h := range headerCases {
		f.Add(h)
	}
	table := outbox.Table{Database: "db", Schema: "s", Name: "t"}
	f.Fuzz(func(t *testing.T, headers string) {
		r := &outbox.Row{ID: 1, Headers: pgtype.Text{String: headers, Valid: true}, CreatedAt: time.Unix(1700000000, 5000)}
		readAt := time.Unix(1700000001, 123456789)
		sameMessage(t, table.Message(r, "p", readAt), referenceMessage(table, r, "p", readAt))
	})
}
