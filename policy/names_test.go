package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
)

// loadNames reads one team-b pipeline with the test sinks and RabbitMQ's.
func loadNames(t *testing.T, yaml string) *pipelines.Spec {
	t.Helper()
	r := registry()
	rabbitmq.Register(r)
	specs, err := pipelines.Loader{Registry: r, LookupEnv: func(string) (string, bool) { return "", false }}.LoadBytes("store:p", []byte(yaml))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return specs[0]
}

// Every name a tenant's pipeline makes Ferry send a broker — what it
// publishes to, and the queues and consumer groups the doctor asks about
// — is judged by the tenant's destination prefixes; a broker's own
// namespaces and names with control characters are refused even when the
// admin allows every destination (""); a Kafka client id is the tenant's
// own. Each refusal names the YAML path.
func TestCheckNames(t *testing.T) {
	everything := policy.Policy{Databases: []string{"db.internal:5432/orders"},
		Brokers: []string{"nats.internal:4222", "mq.internal:5672", "kafka.internal:9092"}, Destinations: []string{""}}
	teamB := everything
	teamB.Destinations = []string{"team-b."}
	const (
		mq    = `{type: rabbitmq, url: "amqp://u:p@mq.internal:5672/", exchange: %s, routing_key: %s%s}`
		kafk  = `{type: kafka, brokers: ["kafka.internal:9092"], topic: %s%s}`
		natsS = `{type: nats, url: "nats://nats.internal:4222", subject: %s}`
		// filesink's Validate checks nothing: what the policy refuses
		// by itself, whatever the sink's Validate says.
		bare = `{type: filesink, url: "nats://nats.internal:4222", subject: %q}`
	)
	f := func(format string, args ...any) string {
		return pipeline("p", "team-b", "", "", fmt.Sprintf(format, args...), "")
	}
	for _, c := range []struct {
		name string
		yaml string
		pol  policy.Policy
		want []string // each "path: " + the start of its message, in order
	}{
		{"another tenant's queue", f(mq, "team-b.x", "team-b.k", ", consumer_queues: [team-b.orders, team-a.orders]"), teamB,
			[]string{`sink.consumer_queues[1]: destination "team-a.orders" is not allowed for tenant team-b`}},
		{"another tenant's consumer group", f(kafk, "team-b.t", ", consumer_groups: [team-a.billing]"), teamB,
			[]string{`sink.consumer_groups[0]: destination "team-a.billing" is not allowed for tenant team-b`}},
		{"its own queues and groups", f(kafk, "team-b.t", ", consumer_groups: [team-b.billing]"), teamB, nil},
		{"a server-named queue", f(mq, "x", "k", ", consumer_queues: [amq.gen-JzTY20BRgKO-HjmUJj0wLg]"), everything,
			[]string{`sink.consumer_queues[0]: "amq.gen-JzTY20BRgKO-HjmUJj0wLg" is reserved: amq. is RabbitMQ's own`}},
		{"RabbitMQ's exchanges", f(mq, "amq.topic", "k", ""), everything,
			[]string{`sink.exchange: "amq.topic" is reserved: amq. is RabbitMQ's own exchanges and queues`}},
		{"JetStream's API", f(bare, "$JS.API.STREAM.DELETE.ORDERS"), everything,
			[]string{`sink.subject: "$JS.API.STREAM.DELETE.ORDERS" is reserved: $JS. is NATS JetStream's API`}},
		{"the system account", f(bare, "$SYS.REQ.SERVER.PING"), everything, []string{`sink.subject: "$SYS.REQ.SERVER.PING" is reserved: $SYS.`}},
		{"a key-value bucket", f(natsS, "$KV.config.x"), everything, []string{`sink.subject: "$KV.config.x" is reserved: $ is NATS system subjects`}},
		{"an object store", f(natsS, "$O.files.C.x"), everything, []string{`sink.subject: "$O.files.C.x" is reserved: $ is`}},
		{"reply inboxes", f(natsS, "_INBOX.abc"), everything, []string{`sink.subject: "_INBOX.abc" is reserved: _INBOX. is NATS request-reply inboxes`}},
		{"Kafka's offsets", f(bare, "__consumer_offsets"), everything, []string{`sink.subject: "__consumer_offsets" is reserved: __consumer_offsets is Kafka's consumer group offsets`}},
		{"Kafka's transactions", f(bare, "__transaction_state"), everything, []string{`sink.subject: "__transaction_state" is reserved`}},
		{"Kafka's internal topics", f(kafk, "__cluster_metadata", ""), everything, []string{`sink.topic: "__cluster_metadata" is reserved: __ is Kafka's internal topics`}},
		{"the schema registry", f(bare, "_schemas"), everything, []string{`sink.subject: "_schemas" is reserved: _schemas is the schema registry's own topic`}},
		{"Confluent's topics", f(kafk, "_confluent-metrics", ""), everything, []string{`sink.topic: "_confluent-metrics" is reserved`}},
		{"CR LF in a subject", f(bare, "team-b.x\r\nPUB team-a.orders 2"), everything,
			[]string{`sink.subject: "team-b.x\r\nPUB team-a.orders 2" has a control character (byte 0x0d at 8)`}},
		{"DEL in a subject", f(bare, "team-b.x\x7f"), everything, []string{`sink.subject: "team-b.x\x7f" has a control character (byte 0x7f at 8)`}},
		{"a reserved template", pipeline("p", "team-b", "", "  - {type: event_router, topic: \"$KV.${route}\"}\n", "", ""), everything,
			[]string{`transforms[0].topic: "$KV.${route}" is reserved`}},
		{"a reserved dead-letter topic", pipeline("p", "team-b", "", "", "", "dead_letter: {topic: _INBOX.dlq}\n"), everything,
			[]string{`dead_letter.topic: "_INBOX.dlq" is reserved`}},
		{"another tenant's client id", f(kafk, "team-b.t", ", client_id: team-a.ferry"), teamB,
			[]string{`sink.client_id: client id "team-a.ferry" is not tenant team-b's: brokers apply quotas per client id`}},
		{"a longer tenant's client id", f(kafk, "team-b.t", ", client_id: team-bb.ferry"), teamB,
			[]string{`sink.client_id: client id "team-bb.ferry" is not tenant team-b's`}},
		{"the admin's client id", f(kafk, "team-b.t", ", client_id: ferry"), teamB, []string{`sink.client_id: client id "ferry" is not`}},
		{"its own client ids", f(kafk, "team-b.t", ", client_id: team-b.billing"), teamB, nil},
		{"its name as client id", f(kafk, "team-b.t", ", client_id: team-b"), teamB, nil},
		{"the default client id", f(kafk, "team-b.t", ""), teamB, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := loadNames(t, c.yaml)
			got := problems(policy.Check(spec, c.pol, policy.CheckEnv{}))
			ok := len(got) == len(c.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.HasPrefix(got[i], c.want[i])
			}
			if !ok {
				t.Errorf("problems\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// At publish, a per-event topic that is a broker's own or has a control
// character is never a tenant's, whatever its prefixes; ForbiddenName
// refuses the commands-to-the-broker ones for every pipeline. Neither
// allocates for a topic it lets through.
func TestNamesAtPublish(t *testing.T) {
	all := policy.Policy{Destinations: []string{""}}
	for topic, want := range map[string]struct{ tenant, everyone bool }{
		"orders.created":             {true, true},
		"amq.topic":                  {false, true},
		"$KV.config.x":               {false, true},
		"_INBOX.x":                   {false, true},
		"__strimzi_store_topic":      {false, true},
		"$JS.API.STREAM.DELETE.X":    {false, false},
		"$SYS.REQ.SERVER.PING":       {false, false},
		"__consumer_offsets":         {false, false},
		"__transaction_state":        {false, false},
		"_schemas":                   {false, false},
		"orders.x\r\nPUB team-a.x 2": {false, false},
		"orders.x\n":                 {false, false},
		"orders.\x00":                {false, false},
		"orders.\x7f":                {false, false},
		"orders.\t":                  {false, false},
	} {
		if got := all.AllowsDestination(topic); got != want.tenant {
			t.Errorf("AllowsDestination(%q) = %v, want %v", topic, got, want.tenant)
		}
		if got := policy.ForbiddenName(topic) == ""; got != want.everyone {
			t.Errorf("ForbiddenName(%q) = %q, want allowed=%v", topic, policy.ForbiddenName(topic), want.everyone)
		}
	}
	if n := testing.AllocsPerRun(100, func() { all.AllowsDestination("orders.created"); policy.ForbiddenName("orders.created") }); n != 0 {
		t.Errorf("%v allocations per allowed topic", n)
	}
}
