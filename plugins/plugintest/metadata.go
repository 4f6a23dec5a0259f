package plugintest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// CheckMetadata reports how msg breaks the metadata contract every source
// keeps (plugins.Meta…), for the event w written at or after writtenAt and
// recorded at recordedAt: a non-empty event id; outbox_id the row's id;
// position set; created_at and read_at in plugins.FormatTime's form, read_at
// between the write and the publish (read_to_ack lag is measured from it);
// ferry_db_read_at and ferry_commit_at Unix nanoseconds when set (the
// commit_to_read lag); and, unless rowMetadata (the source publishes the
// row's own metadata), aggregate_type, aggregate_id and event_type as
// written.
func CheckMetadata(md map[string]string, uuid string, w Written, writtenAt, recordedAt time.Time, rowMetadata bool) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if uuid == "" {
		fail("the message has no UUID (event id)")
	}
	if got := md[plugins.MetaOutboxID]; got != strconv.FormatInt(w.OutboxID, 10) {
		fail("%s = %q, want the row id %d", plugins.MetaOutboxID, got, w.OutboxID)
	}
	if md[plugins.MetaPosition] == "" {
		fail("%s is not set", plugins.MetaPosition)
	}
	if _, err := plugins.ParseTime(md[plugins.MetaCreatedAt]); err != nil {
		fail("%s = %q: %v", plugins.MetaCreatedAt, md[plugins.MetaCreatedAt], err)
	}
	// The relay clock is this process's (or a child's on this machine); a
	// little slack for the microsecond rounding of FormatTime.
	const slack = time.Millisecond
	if readAt, err := plugins.ParseTime(md[plugins.MetaReadAt]); err != nil {
		fail("%s = %q: %v", plugins.MetaReadAt, md[plugins.MetaReadAt], err)
	} else if readAt.Before(writtenAt.Add(-slack)) || readAt.After(recordedAt.Add(slack)) {
		fail("%s = %s, not between the write (%s) and the publish (%s)", plugins.MetaReadAt,
			readAt.Format(time.RFC3339Nano), writtenAt.Format(time.RFC3339Nano), recordedAt.Format(time.RFC3339Nano))
	}
	for _, k := range []string{plugins.MetaDBReadAt, plugins.MetaCommitAt} {
		if v, ok := md[k]; ok {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				fail("%s = %q, want Unix nanoseconds", k, v)
			}
		}
	}
	if !rowMetadata {
		for k, want := range map[string]string{plugins.MetaAggregateType: "order", plugins.MetaAggregateID: w.Aggregate, plugins.MetaEventType: "OrderUpdated"} {
			if md[k] != want {
				fail("%s = %q, want %q", k, md[k], want)
			}
		}
	}
	return bad
}

// testMetadata: an event's message carries the metadata every later stage
// reads (transforms, sinks' formats, lag).
func testMetadata(t *testing.T, h SourceHarness) {
	e := SetupSource(t, h)
	e.Start(t, e.YAML("metadata", 100))
	ctx := context.Background()
	before := time.Now()
	w, err := e.Insert(ctx, e.Pool, "agg-meta")
	if err != nil {
		t.Fatal(err)
	}
	recs := e.WaitFor(t, 30*time.Second, "the event", delivered(t, w.OutboxID))
	for _, r := range recs {
		for _, p := range CheckMetadata(r.Metadata, r.UUID, w, before, r.At, h.Features.RowMetadata) {
			t.Errorf("metadata contract: %s (metadata %v)", p, r.Metadata)
		}
	}
}
