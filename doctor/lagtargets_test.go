package doctor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// A tenant's consumer group may have committed offsets on another
// tenant's topic: with the tenant's destinations given (as the API gives
// them for a tenant's pipeline), the consumer stage reports the lag on
// the tenant's own topics only, and never names the other one. Without
// them (the admin's pipelines) it reports both.
func TestConsumerLagOnlyOnAllowedTopics(t *testing.T) {
	e := relaytest.Setup(t, harness)
	ctx := context.Background()
	srv := testenv.StartKafka(t)
	own := "team-b." + strings.ToLower(e.Stream)
	other := "team-a.orders-" + strings.ToLower(e.Stream)
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, own, 1)
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, other, 1)
	y := fmt.Sprintf("name: billing\nsource: {type: xid8, dsn: %q, poll_interval: 20ms}\nsink: {type: kafka, brokers: [%q], topic: %s, consumer_groups: [team-b.billing]}\n",
		e.DSN, srv.Addr(), own)
	e.Start(t, y)
	for range 4 {
		plugintest.Insert(ctx, e.Pool, "agg-1")
	}
	coll := testenv.CollectKafka(t, []string{srv.Addr()}, []string{own})
	testenv.Eventually(t, 60*time.Second, "4 records on the topic", func() bool { return coll.Len() >= 4 })
	testenv.CommitKafkaOffset(t, []string{srv.Addr()}, "team-b.billing", own, 1)
	testenv.CommitKafkaOffset(t, []string{srv.Addr()}, "team-b.billing", other, 0)

	for _, restricted := range []bool{false, true} {
		o := opts
		if restricted {
			o.Destinations = func(topic string) bool { return strings.HasPrefix(topic, "team-b.") }
		}
		d := diagnose(t, load(t, y), o, "", 0)
		ev := strings.Join(d.Checks[len(d.Checks)-1].Evidence, " ")
		if !strings.Contains(ev, "group team-b.billing on "+own+": 3 behind") {
			t.Errorf("restricted=%v: consumer evidence %q, want the lag on %s", restricted, ev, own)
		}
		if strings.Contains(ev, other) != !restricted {
			t.Errorf("restricted=%v: consumer evidence %q: names %s %v, want %v", restricted, ev, other, strings.Contains(ev, other), !restricted)
		}
	}
}
