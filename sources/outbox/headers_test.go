package outbox

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ferryhq/ferry/plugins"
)

// TestScanFlatHeaders makes sure the shapes rows carry are read in place
// (else every event would pay for encoding/json again), with the entries
// encoding/json reads.
func TestScanFlatHeaders(t *testing.T) {
	for _, raw := range []string{
		`{}`, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		`{"tenant": "acme", "content-type": "application/json", "attempt": 3, "retry": false, "ttl": null}`,
		`{"a":"1","b":-2.5e3}`, " {\n  \"ünï\": \"cödé ☃\"\n} ",
	} {
		got, ok := scanFlatHeaders(raw, nil)
		if !ok {
			t.Errorf("%s: not read in place", raw)
			continue
		}
		want, errText := decodeHeadersJSON(raw, nil)
		if errText != "" || !maps.Equal(asMap(got), asMap(want)) {
			t.Errorf("%s: read %q, encoding/json reads %q (%s)", raw, got, want, errText)
		}
	}
	for _, raw := range []string{`{"a":{}}`, `{"a":[]}`, `{"a":"\n"}`, `{"\u0061":"b"}`, "{\"a\":\"\xff\"}", `{"a":1,}`, `[]`} {
		if _, ok := scanFlatHeaders(raw, nil); ok {
			t.Errorf("%s: read in place, but is encoding/json's to read", raw)
		}
	}
}

func asMap(hs []header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.key] = h.value
	}
	return m
}

// isoTimeCases are timestamps as PostgreSQL prints them, and near misses.
var isoTimeCases = []string{
	"2026-12-01 14:44:45.123456+00", "2026-12-01 14:44:45+00", "2026-12-01 14:44:45.1-05", "2026-12-01 14:44:45.000001+05:30",
	"1900-02-28 00:00:00+05:53:28", "0001-01-01 00:00:00+00", "2024-02-29 23:59:59.999999-12", "2023-02-29 00:00:00+00",
	"9999-12-31 23:59:59.999999+14", "2026-12-01 14:44:45", "2026-12-01 14:44:45.1234567+00", "2026-12-01 24:00:00+00",
	"2026-13-01 00:00:00+00", "2026-00-10 00:00:00+00", "2026-04-31 00:00:00+00", "2026-12-01 14:60:00+00",
	"2026-12-01 14:44:45.+00", "2026-12-01 14:44:45+0", "2026-12-01 14:44:45+00:", "2026-12-01 14:44:45+00:60",
	"2026-12-01 14:44:45+00 BC", "12026-12-01 14:44:45+00", "0000-01-01 00:00:00+00", "infinity", "-infinity",
	"2026-12-01T14:44:45Z", "2026-12-01 14:44:45 +00", " 2026-12-01 14:44:45+00", "2026-1a-01 00:00:00+00", "",
}

// TestParseISOTime holds the fast timestamp reading to pgtype's.
func TestParseISOTime(t *testing.T) {
	for _, s := range isoTimeCases {
		checkISOTime(t, s)
	}
	for _, s := range []string{"2026-12-01 14:44:45.123456+00", "2026-12-01 14:44:45+02"} {
		if _, ok := parseISOTime(s, true); !ok {
			t.Errorf("%s: not read fast", s)
		}
	}
}

func FuzzParseISOTime(f *testing.F) {
	for _, s := range isoTimeCases {
		f.Add(s)
	}
	f.Fuzz(checkISOTime)
}

func checkISOTime(t *testing.T, s string) {
	for _, zone := range []bool{false, true} {
		oid := uint32(pgtype.TimestampOID)
		if zone {
			oid = pgtype.TimestamptzOID
		}
		got, ok := parseISOTime(s, zone)
		if !ok {
			continue
		}
		var want time.Time
		if err := textMap.Scan(oid, pgtype.TextFormatCode, []byte(s), &want); err != nil {
			t.Fatalf("%q (zone %v): read as %v, pgtype says %v", s, zone, got, err)
		}
		if !got.Equal(want) || got.Location().String() != want.Location().String() {
			t.Fatalf("%q (zone %v): read as %v, pgtype reads %v", s, zone, got, want)
		}
	}
}

// A row's headers may not set what steers the broker or stands for Ferry
// (plugins.ReservedHeader): Message drops them and lists them for the
// pipeline to count; the replay headers a poll backfill writes pass.
func TestMessageDropsReservedHeaders(t *testing.T) {
	r := &Row{Payload: []byte(`{}`)}
	r.RowID = pgtype.Text{String: "7", Valid: true}
	r.Headers = pgtype.Text{String: `{"Nats-Msg-Id": "x", "_watermill_message_uuid": "y", "ferry-aggregate-version": "9", "ferry-replay": "true", "traceparent": "t"}`, Valid: true}
	m := Table{Database: "db", Schema: "public", Name: "outbox"}.Message(r, "7", time.Now())
	for _, k := range []string{"Nats-Msg-Id", "_watermill_message_uuid", "ferry-aggregate-version"} {
		if v, ok := m.Metadata[k]; ok {
			t.Errorf("metadata %s=%q kept", k, v)
		}
	}
	if m.Metadata["traceparent"] != "t" || m.Metadata["ferry-replay"] != "true" {
		t.Errorf("the row's own headers lost: %v", m.Metadata)
	}
	got := strings.Split(m.Metadata[plugins.MetaReservedHeaders], ",")
	slices.Sort(got)
	if want := []string{"Nats-Msg-Id", "_watermill_message_uuid", "ferry-aggregate-version"}; !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", plugins.MetaReservedHeaders, got, want)
	}
}
