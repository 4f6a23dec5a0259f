package plugintest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// CheckMetadata reports how msg breaks the metadata contract every source
// keeps, for the event w written at or after writtenAt and recorded at
// recordedAt. It is plugins.CheckSourceMetadata — the contract's one
// statement: event id, position, created_at and read_at as times, the
// nanosecond clocks, outbox_id, the aggregate and event type — plus what
// only a test that wrote the row can know: outbox_id is the row's id,
// read_at lies between the write and the publish (read_to_ack lag is
// measured from it), and, unless rowMetadata (the source publishes the
// row's own metadata in place of the descriptive keys), aggregate_type,
// aggregate_id and event_type are the values written.
func CheckMetadata(md map[string]string, uuid string, w Written, writtenAt, recordedAt time.Time, rowMetadata bool) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	msg := message.NewMessage(uuid, nil)
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	descriptive := map[string]string{plugins.MetaAggregateType: "order", plugins.MetaAggregateID: w.Aggregate, plugins.MetaEventType: "OrderUpdated"}
	for _, err := range plugins.Flatten(plugins.CheckSourceMetadata(msg)) {
		var fe *plugins.FieldError
		if rowMetadata && errors.As(err, &fe) && descriptive[fe.Path] != "" {
			continue
		}
		fail("%v", err)
	}
	if got, ok := md[plugins.MetaOutboxID]; ok && got != strconv.FormatInt(w.OutboxID, 10) {
		fail("%s = %q, want the row id %d", plugins.MetaOutboxID, got, w.OutboxID)
	}
	// The relay clock is this process's (or a child's on this machine); a
	// little slack for the microsecond rounding of FormatTime.
	const slack = time.Millisecond
	if readAt, err := plugins.ParseTime(md[plugins.MetaReadAt]); err == nil &&
		(readAt.Before(writtenAt.Add(-slack)) || readAt.After(recordedAt.Add(slack))) {
		fail("%s = %s, not between the write (%s) and the publish (%s)", plugins.MetaReadAt,
			readAt.Format(time.RFC3339Nano), writtenAt.Format(time.RFC3339Nano), recordedAt.Format(time.RFC3339Nano))
	}
	if !rowMetadata {
		for k, want := range descriptive {
			if got, ok := md[k]; ok && got != want {
				fail("%s = %q, want %q", k, got, want)
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
