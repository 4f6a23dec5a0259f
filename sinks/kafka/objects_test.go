package kafka_test

import (
	"context"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sinks/kafka"
)

// existingTopics are those of names the brokers know, asking them not to
// create any.
func existingTopics(t *testing.T, addr string, names ...string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	for _, name := range names {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tp := range resp.Topics {
		if tp.ErrorCode == 0 {
			out = append(out, *tp.Topic)
		}
	}
	slices.Sort(out)
	return out
}

// A dry start (a connect check) creates no topic and says which it would;
// a tenant's pipeline creates its default topic and none it is routed to,
// which may be computed from the rows.
func TestCreateTopicsTenantAndDry(t *testing.T) {
	srv := testenv.StartKafka(t)
	base := testenv.Name("ferry")
	cfg := kafka.DefaultConfig()
	cfg.Brokers, cfg.Topic, cfg.CreateTopics = []string{srv.Addr()}, base+".default", &kafka.TopicSpec{Partitions: 1}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	env := plugins.Env{Pipeline: "a-orders", Tenant: "team-a", Logger: plugintest.Logger()}

	dry := kafka.New(cfg, env)
	t.Cleanup(func() { dry.Close() })
	notes, err := dry.DryStart(context.Background())
	if err != nil || !slices.Equal(notes, []string{"would create topic " + base + ".default"}) {
		t.Fatalf("dry start: %q, %v; want a note that it would create the default topic", notes, err)
	}
	if got := existingTopics(t, srv.Addr(), base+".default"); len(got) != 0 {
		t.Fatalf("a dry start created %v", got)
	}

	s := kafka.New(cfg, env)
	t.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(base+".routed", message.NewMessage("r-1", []byte("x"))); err == nil {
		t.Error("a publish to a routed topic that does not exist succeeded")
	}
	if got := existingTopics(t, srv.Addr(), base+".default", base+".routed"); !slices.Equal(got, []string{base + ".default"}) {
		t.Fatalf("topics %v, want the default topic only", got)
	}
}
