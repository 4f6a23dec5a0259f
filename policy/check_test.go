package policy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/transforms/router"
)

// Test components: a source that declares no endpoints, a sink that
// declares neither endpoints nor destinations, and a sink with a field
// naming a file.
type plainSource struct {
	DSN string `yaml:"dsn"`
}

func (*plainSource) Validate() error { return nil }

type opaqueSink struct {
	URL string `yaml:"url"`
}

func (*opaqueSink) Validate() error { return nil }

type fileSink struct {
	URL     string `yaml:"url"`
	Subject string `yaml:"subject"`
	TLS     struct {
		CAFile  string   `yaml:"ca_file" ferry:"file"`
		Servers []string `yaml:"servers"`
	} `yaml:"tls"`
	Extra struct {
		Creds []string `yaml:"creds" ferry:"file"`
	} `yaml:",inline"`
}

func (*fileSink) Validate() error { return nil }
func (c *fileSink) Endpoints() ([]plugins.Endpoint, error) {
	e, err := plugins.URLEndpoint("url", c.URL, "nats")
	return []plugins.Endpoint{e}, err
}
func (c *fileSink) Destinations() []plugins.Destination {
	return []plugins.Destination{{Path: "subject", Name: c.Subject}}
}

type nopSink struct{}

func (nopSink) Start(context.Context) error                                        { return nil }
func (nopSink) Close() error                                                       { return nil }
func (nopSink) Publish(string, ...*message.Message) error                          { return nil }
func (nopSink) Subscribe(context.Context, string) (<-chan *message.Message, error) { return nil, nil }

func registry() *plugins.Registry {
	r := plugins.NewRegistry()
	xid8.Register(r)
	poll.Register(r)
	nats.Register(r)
	kafka.Register(r)
	router.Register(r)
	plugins.RegisterSource(r, "plain", func() *plainSource { return &plainSource{} },
		func(*plainSource, plugins.Env) (plugins.Source, error) { return nopSink{}, nil })
	plugins.RegisterSink(r, "opaque", func() *opaqueSink { return &opaqueSink{} },
		func(*opaqueSink, plugins.Env) (plugins.Sink, error) { return nopSink{}, nil })
	plugins.RegisterSink(r, "filesink", func() *fileSink { return &fileSink{} },
		func(*fileSink, plugins.Env) (plugins.Sink, error) { return nopSink{}, nil })
	return r
}

// load reads one pipeline as the store's converger would.
func load(t *testing.T, name, yaml string) *pipelines.Spec {
	t.Helper()
	specs, err := pipelines.Loader{Registry: registry(), LookupEnv: func(string) (string, bool) { return "", false }}.
		LoadBytes("store:"+name, []byte(yaml))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return specs[0]
}

// pipeline is a tenant pipeline's YAML: an xid8 source on dsn, the given
// transforms, a NATS sink, and more top-level keys.
func pipeline(name, tenant, source, transforms, sink, more string) string {
	if source == "" {
		source = `{type: xid8, dsn: "postgres://orders:s3cret@db.internal:5432/orders"}`
	}
	if sink == "" {
		sink = `{type: nats, url: "nats://nats.internal:4222", subject: orders.default}`
	}
	y := fmt.Sprintf("name: %s\n", name)
	if tenant != "" {
		y += "tenant: " + tenant + "\n"
	}
	y += "source: " + source + "\n"
	if transforms != "" {
		y += "transforms:\n" + transforms
	}
	return y + "sink: " + sink + "\n" + more
}

// allowed is team-b's policy for the default pipeline.
var allowed = policy.Policy{
	Databases:    []string{"db.internal:5432/orders"},
	Brokers:      []string{"nats.internal:4222"},
	Destinations: []string{"orders."},
}

func with(p policy.Policy, f func(*policy.Policy)) policy.Policy {
	p.Databases = slices.Clone(p.Databases)
	p.Brokers = slices.Clone(p.Brokers)
	p.Destinations = slices.Clone(p.Destinations)
	f(&p)
	return p
}

// problems renders errors as "path: message" in order.
func problems(errs []*pipelines.Error) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Path+": "+e.Msg)
	}
	return out
}

func TestCheck(t *testing.T) {
	teamA := load(t, "a-orders", pipeline("a-orders", "team-a", "", "", "", ""))
	teamAPublic := load(t, "a-public", pipeline("a-public", "team-a", `{type: xid8, dsn: "postgres://a@db.internal/orders", table: public.outbox}`, "", "", ""))
	admin := load(t, "admin-orders", pipeline("admin-orders", "", `{type: xid8, dsn: "host=db2.internal dbname=billing user=admin"}`, "", "", ""))
	sameTenant := load(t, "b-other", pipeline("b-other", "team-b", "", "", "", ""))
	reserved, err := policy.Reserve("the store", "postgres://ferry:pw@127.0.0.1:5432/ferry")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		yaml   string // a team-b pipeline
		pol    policy.Policy
		others []*pipelines.Spec
		want   []string // each "path: " + a part of its message, in order
	}{
		{name: "allowed", yaml: pipeline("p", "team-b", "", "", "", ""), pol: allowed},
		{name: "default deny", yaml: pipeline("p", "team-b", "", "", "", ""), want: []string{
			"source.dsn: database db.internal:5432/orders is not allowed for tenant team-b (an admin allows it: ferry tenants set team-b --allow-database db.internal:5432/orders)",
			"sink.url: broker nats.internal:4222 is not allowed for tenant team-b (an admin allows it: ferry tenants set team-b --allow-broker nats.internal:4222)",
			`sink.subject: destination "orders.default" is not allowed for tenant team-b (an admin allows a prefix of it: ferry tenants set team-b --allow-destination PREFIX)`,
		}},
		{name: "denied database and broker", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db9:6000/payments"}`, "",
			`{type: kafka, brokers: ["kafka-1:9092,kafka-2:9092"], topic: orders.x}`, ""),
			pol: with(allowed, func(p *policy.Policy) { p.Brokers = append(p.Brokers, "kafka-1:9092") }),
			want: []string{
				"source.dsn: database db9:6000/payments is not allowed",
				"sink.brokers[0]: broker kafka-2:9092 is not allowed for tenant team-b (an admin allows it: ferry tenants set team-b --allow-broker kafka-2:9092)",
			}},
		{name: "loopback folding", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@127.0.0.1/orders"}`, "",
			`{type: nats, url: "nats://[::1]:4222,nats://LOCALHOST", subject: orders.x}`, ""),
			pol: policy.Policy{Databases: []string{"localhost:5432/orders"}, Brokers: []string{"127.0.0.1:4222"}, Destinations: []string{"orders."}}},
		{name: "* is any database of the server", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db2:5432/anything"}`, "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.Databases = []string{"db2:5432/*"} })},
		{name: "* is one server only", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db3:5432/anything"}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.Databases = []string{"db2:5432/*"} }),
			want: []string{"source.dsn: database db3:5432/anything is not allowed"}},
		{name: "allowed for another user", yaml: pipeline("p", "team-b", "", "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.Databases = []string{"db.internal:5432/orders/ferry_orders"} }),
			want: []string{"source.dsn: database db.internal:5432/orders as user orders is not allowed for tenant team-b " +
				"(an admin allows it: ferry tenants set team-b --allow-database db.internal:5432/orders/orders)"}},
		{name: "allowed for its user", yaml: pipeline("p", "team-b", "", "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.Databases = []string{"db.internal:5432/orders/orders"} })},
		{name: "the store, even when allowed", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@localhost/ferry"}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.Databases = []string{"localhost:5432/*"} }),
			want: []string{"source.dsn: database localhost:5432/ferry is reserved (the store): no tenant's pipeline may read it"}},
		{name: "another tenant's database", yaml: pipeline("p", "team-b", "", "", "", ""), pol: allowed, others: []*pipelines.Spec{teamA},
			want: []string{"source.dsn: database db.internal:5432/orders is read by a pipeline of another tenant, which tenant team-b may not read " +
				"(an admin allows it: ferry tenants set team-b --shared-databases)"}},
		{name: "the admin's database, read from its keyword DSN", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@DB2.internal/billing"}`, "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.Databases = []string{"db2.internal:5432/billing"} }), others: []*pipelines.Spec{admin},
			want: []string{"source.dsn: database db2.internal:5432/billing is read by a pipeline of another tenant"}},
		{name: "its own tenant's database", yaml: pipeline("p", "team-b", "", "", "", ""), pol: allowed, others: []*pipelines.Spec{sameTenant}},
		{name: "shared databases without retention", yaml: pipeline("p", "team-b", "", "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.SharedDatabases = true }), others: []*pipelines.Spec{teamA}},
		{name: "shared databases, retention on the same table",
			yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders", table: public.outbox, retention: {after: 0s}}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.SharedDatabases = true }), others: []*pipelines.Spec{teamA},
			want: []string{"source.retention: removes rows of table public.outbox of database db.internal:5432/orders (retention, or the poll source's claims), " +
				"which a pipeline of another tenant reads: never allowed, even with shared databases"}},
		{name: "shared databases, retention on another table",
			yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders", table: team_b.outbox, retention: {after: 1h}}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.SharedDatabases = true }), others: []*pipelines.Spec{teamAPublic}},
		// team-a's unqualified "outbox" is whichever schema its search_path
		// finds first: it may be team_b.outbox.
		{name: "shared databases, retention on a table another reads unqualified",
			yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders", table: team_b.outbox, retention: {after: 1h}}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.SharedDatabases = true }), others: []*pipelines.Spec{teamA},
			want: []string{"source.retention: removes rows of table team_b.outbox"}},
		{name: "shared databases, a poll source claims the rows",
			yaml: pipeline("p", "team-b", `{type: poll, dsn: "postgres://u@db.internal/orders"}`, "", "", ""),
			pol:  with(allowed, func(p *policy.Policy) { p.SharedDatabases = true }), others: []*pipelines.Spec{teamA},
			want: []string{"source.on_delivered: removes rows of table outbox"}},
		{name: "file parameters", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders?sslcrl=/etc/ssl/crl.pem&passfile=/nonexistent/.pgpass"}`, "", "", ""),
			pol: allowed, want: []string{"source.dsn: names a file or service on the relay's machine (sslcrl, passfile), which tenant team-b may not " +
				"(an admin allows it: ferry tenants set team-b --allow-files)"}},
		{name: "file parameters allowed", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders?sslcrldir=/etc/ssl/crls"}`, "", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.AllowFiles = true })},
		{name: "socket, even with files allowed", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://u@db.internal/orders?host=/var/run/postgresql"}`, "", "", ""),
			pol: with(allowed, func(p *policy.Policy) {
				p.AllowFiles = true
				p.Databases = append(p.Databases, "/var/run/postgresql:5432/orders")
			}),
			want: []string{"source.dsn: a unix-socket host is never allowed for a tenant's pipeline"}},
		{name: "keyword DSN", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "host=db.internal user=u dbname=orders"}`, "", "", ""), pol: allowed,
			want: []string{"source.dsn: not a URL postgres://user@host[:port]/database: the server a keyword/value connection string reaches depends on the relay's environment"}},
		{name: "missing user", yaml: pipeline("p", "team-b", `{type: xid8, dsn: "postgres://db.internal/orders"}`, "", "", ""), pol: allowed,
			want: []string{"source.dsn: names no user"}},
		{name: "a source without endpoints", yaml: pipeline("p", "team-b", `{type: plain, dsn: "postgres://u@db.internal/orders"}`, "", "", ""), pol: allowed,
			want: []string{"source: type plain declares no endpoints (it implements no plugins.Endpointer): it could connect anywhere, so tenant team-b's pipelines may not use it"}},
		{name: "a sink without endpoints or destinations", yaml: pipeline("p", "team-b", "", "", `{type: opaque, url: "x://y"}`, ""), pol: allowed,
			want: []string{"sink: type opaque declares no endpoints", "sink: type opaque declares no destinations"}},
		{name: "file fields", yaml: pipeline("p", "team-b", "", "", `{type: filesink, url: "nats://nats.internal", subject: orders.x, tls: {ca_file: /etc/ca.pem, servers: [a]}, creds: ["", /etc/creds]}`, ""),
			pol: allowed, want: []string{
				"sink.tls.ca_file: names a file on the relay's machine, which tenant team-b may not (an admin allows it: ferry tenants set team-b --allow-files)",
				"sink.creds[1]: names a file on the relay's machine",
			}},
		{name: "file fields allowed", yaml: pipeline("p", "team-b", "", "", `{type: filesink, url: "nats://nats.internal", subject: orders.x, tls: {ca_file: /etc/ca.pem}}`, ""),
			pol: with(allowed, func(p *policy.Policy) { p.AllowFiles = true })},
		{name: "destinations: static and templates", pol: allowed, yaml: pipeline("p", "team-b", "", `  - {type: canary, topic: ferry.canary.b}
  - {type: event_router, topic: "outbox.event.${route}", fallback_topic: "orders.unrouted", event_type_topics: {Paid: "${aggregate_type}.paid", Placed: "orders.${route}"}}
`, `{type: nats, url: "nats://nats.internal:4222", subject: payments.default, create_stream: {name: B, subjects: ["orders.>", ">"]}}`, ""),
			want: []string{
				`transforms[0].topic: destination "ferry.canary.b" is not allowed for tenant team-b`,
				`transforms[1].topic: destination pattern "outbox.event.${route}" is not allowed for tenant team-b: its fixed part "outbox.event." must start with an allowed prefix ` +
					"(an admin allows one: ferry tenants set team-b --allow-destination PREFIX)",
				`transforms[1].event_type_topics.Paid: destination pattern "${aggregate_type}.paid" starts with a placeholder, so its events could go anywhere`,
				`sink.subject: destination "payments.default" is not allowed`,
				`sink.create_stream.subjects[1]: destination ">" is not allowed`,
				`sink.create_stream.name: stream "B" is not under a destination prefix allowed for tenant team-b`,
			}},
		{name: "dead_letter.topic", pol: allowed, yaml: pipeline("p", "team-b", "", "", "", "dead_letter: {topic: team-a.dlq}\n"),
			want: []string{`dead_letter.topic: destination "team-a.dlq" is not allowed for tenant team-b`}},
		{name: "dead_letter.topic allowed", pol: allowed, yaml: pipeline("p", "team-b", "", "", "", "dead_letter: {topic: orders.dlq}\n")},
		{name: "every destination", yaml: pipeline("p", "team-b", "", "  - {type: event_router, topic: \"${route}\"}\n", "", ""),
			pol: with(allowed, func(p *policy.Policy) { p.Destinations = []string{""} })},
		{name: "no tenant", yaml: pipeline("p", "", "", "", "", ""), pol: allowed,
			want: []string{"tenant: the pipeline has no tenant"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := load(t, "p", c.yaml)
			errs := policy.Check(spec, c.pol, policy.CheckEnv{Others: append(c.others, spec), Reserved: reserved})
			got := problems(errs)
			ok := len(got) == len(c.want)
			for i := 0; ok && i < len(got); i++ {
				ok = strings.HasPrefix(got[i], c.want[i])
			}
			if !ok {
				t.Errorf("problems\n got %q\nwant %q", got, c.want)
			}
			for _, e := range errs {
				if e.File != "store:p" || e.Line != spec.Line || e.Line == 0 {
					t.Errorf("%s: located at %s:%d, want %s:%d", e.Path, e.File, e.Line, spec.File, spec.Line)
				}
				if strings.Contains(e.Error(), "s3cret") || strings.Contains(e.Error(), "@db.internal") || strings.Contains(e.Error(), "dbname=") {
					t.Errorf("%q quotes the DSN", e.Error())
				}
			}
		})
	}
}

// Reserve reads the admin's DSNs as the relay connects them: a keyword
// DSN, a host list, and a socket (which is also localhost over TCP).
func TestReserve(t *testing.T) {
	r, err := policy.Reserve("the HA coordination database", "host=/var/run/postgresql,db2 port=5433 dbname=coord user=ferry")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range r {
		got = append(got, fmt.Sprintf("%s %s:%d/%s", d.Name, d.Host, d.Port, d.Database))
	}
	want := []string{"the HA coordination database /var/run/postgresql:5433/coord", "the HA coordination database localhost:5433/coord",
		"the HA coordination database db2:5433/coord"}
	if !slices.Equal(dedupe(got), want) {
		t.Errorf("reserved %q, want %q", got, want)
	}
	if _, err := policy.Reserve("the store", "postgres://u:s3cret@h:x/db"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %v: want one that does not quote the DSN", err)
	}
}

// dedupe drops adjacent repeats (pgx lists a host once per TLS attempt).
func dedupe(s []string) []string { return slices.Compact(slices.Clone(s)) }

func TestAllowsDestination(t *testing.T) {
	p := policy.Policy{Destinations: []string{"orders.", "team-b."}}
	for topic, want := range map[string]bool{"orders.created": true, "orders.": true, "team-b.x": true, "orders": false, "payments.x": false, "": false} {
		if got := p.AllowsDestination(topic); got != want {
			t.Errorf("AllowsDestination(%q) = %v, want %v", topic, got, want)
		}
	}
	if (policy.Policy{}).AllowsDestination("orders.x") {
		t.Error("the zero policy allows a destination")
	}
	if n := testing.AllocsPerRun(100, func() { p.AllowsDestination("payments.created") }); n != 0 {
		t.Errorf("AllowsDestination allocates %v times per call", n)
	}
}

func TestValidate(t *testing.T) {
	p := policy.Policy{Databases: []string{"db:5432/orders", "db/orders"}, Brokers: []string{"nats:4222", "nats"},
		Destinations: []string{"orders.", "orders.*", "team.>", "${x}", ""}}
	var got []string
	for _, e := range plugins.Flatten(p.Validate()) {
		got = append(got, e.(*plugins.FieldError).Path)
	}
	want := []string{"databases[1]", "brokers[1]", "destinations[1]", "destinations[2]", "destinations[3]"}
	if !slices.Equal(got, want) {
		t.Errorf("problems at %q, want %q", got, want)
	}
}
