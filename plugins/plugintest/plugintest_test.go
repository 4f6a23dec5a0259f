package plugintest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	_ "github.com/ferryhq/ferry/sources/xid8" // the loader needs a source type
)

func TestCheckMetadata(t *testing.T) {
	w := plugintest.Written{OutboxID: 42, Aggregate: "agg-1", Seq: 1}
	written := time.Now()
	recorded := written.Add(50 * time.Millisecond)
	good := func() map[string]string {
		return map[string]string{
			plugins.MetaAggregateType: "order",
			plugins.MetaAggregateID:   "agg-1",
			plugins.MetaEventType:     "OrderUpdated",
			plugins.MetaCreatedAt:     plugins.FormatTime(written),
			plugins.MetaReadAt:        plugins.FormatTime(written.Add(10 * time.Millisecond)),
			plugins.MetaOutboxID:      "42",
			plugins.MetaPosition:      "771/42",
			plugins.MetaDBReadAt:      "1764590000000000000",
		}
	}
	if bad := plugintest.CheckMetadata(good(), "e-1", w, written, recorded, false); len(bad) != 0 {
		t.Fatalf("a message keeping the contract: %v", bad)
	}
	cases := []struct {
		name   string
		change func(map[string]string)
		uuid   string
		rowMD  bool
		want   string
	}{
		{"no uuid", func(map[string]string) {}, "", false, "UUID"},
		{"wrong outbox_id", func(m map[string]string) { m[plugins.MetaOutboxID] = "41" }, "e-1", false, plugins.MetaOutboxID},
		{"no position", func(m map[string]string) { delete(m, plugins.MetaPosition) }, "e-1", false, plugins.MetaPosition},
		{"created_at not a time", func(m map[string]string) { m[plugins.MetaCreatedAt] = "yesterday" }, "e-1", false, plugins.MetaCreatedAt},
		{"no read_at", func(m map[string]string) { delete(m, plugins.MetaReadAt) }, "e-1", false, plugins.MetaReadAt},
		{"read_at after the publish", func(m map[string]string) { m[plugins.MetaReadAt] = plugins.FormatTime(recorded.Add(time.Second)) }, "e-1", false, plugins.MetaReadAt},
		{"db read time not nanoseconds", func(m map[string]string) { m[plugins.MetaDBReadAt] = "now" }, "e-1", false, plugins.MetaDBReadAt},
		{"no aggregate id", func(m map[string]string) { delete(m, plugins.MetaAggregateID) }, "e-1", false, plugins.MetaAggregateID},
		{"row metadata, wrong outbox_id", func(m map[string]string) { delete(m, plugins.MetaAggregateID); m[plugins.MetaOutboxID] = "x" }, "e-1", true, plugins.MetaOutboxID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			md := good()
			c.change(md)
			bad := plugintest.CheckMetadata(md, c.uuid, w, written, recorded, c.rowMD)
			if len(bad) != 1 || !strings.Contains(bad[0], c.want) {
				t.Fatalf("problems %q, want one naming %s", bad, c.want)
			}
		})
	}
}

// The recording sink's file holds what Publish confirmed, in order, and a
// line torn by a killed relay is skipped, not merged with the next one.
func TestRecorder(t *testing.T) {
	rec := plugintest.NewRecording(t)
	specs, err := pipelines.Loader{Registry: plugintest.Registry()}.LoadBytes("p.yaml", []byte("name: p\nsource:\n  type: xid8\n  dsn: postgres://localhost/unused\n"+rec.SinkYAML()))
	if err != nil {
		t.Fatal(err)
	}
	build := func() plugins.Sink {
		s, err := specs[0].Sink.Factory.BuildSink(specs[0].Sink.Config, plugins.Env{Pipeline: "p"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := build()
	if err := s.Publish("", message.NewMessage("early", nil)); err == nil {
		t.Fatal("publish before Start succeeded")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := message.NewMessage("e-1", []byte(`{"agg":"a","seq":1}`))
	m.Metadata.Set(plugins.MetaOutboxID, "1")
	if err := s.Publish("routed", m, message.NewMessage("e-2", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	rec.Down()
	if err := s.Publish("", message.NewMessage("e-down", nil)); err == nil {
		t.Fatal("publish while down succeeded")
	}
	rec.Up()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A relay killed in the middle of a write.
	f, err := os.OpenFile(rec.Path(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"topic":"","uuid":"torn`)
	f.Close()
	if n := rec.Len(); n != 2 {
		t.Fatalf("%d recorded with a torn line pending, want 2", n)
	}
	s = build()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", message.NewMessage("e-3", nil)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	got := rec.All()
	var ids []string
	for _, r := range got {
		ids = append(ids, r.Topic+"/"+r.UUID)
	}
	if strings.Join(ids, " ") != "routed/e-1 routed/e-2 /e-3" {
		t.Fatalf("recorded %v", ids)
	}
	if d := plugintest.DecodeRecorded(t, got[:1]); d[0].OutboxID != 1 || d[0].Aggregate != "a" || d[0].Seq != 1 {
		t.Fatalf("decoded %+v", d[0])
	}
}
