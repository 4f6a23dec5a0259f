package policy

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// CheckEnv is what Check compares a tenant's pipeline with besides its
// policy.
type CheckEnv struct {
	// Others are every other pipeline loaded (file and store, any tenant,
	// and the admin's own): a database one of them reads is another
	// tenant's unless it has the same tenant. A pipeline without a tenant
	// is the admin's, which is "another tenant" to every tenant.
	Others []*pipelines.Spec
	// Reserved are the databases no tenant's pipeline may read, whatever
	// its policy: the store and the HA coordination database (Reserve).
	Reserved []ReservedDatabase
}

// ReservedDatabase is a database of Ferry's own.
type ReservedDatabase struct {
	// Name says what it is in messages: "the store", "the HA coordination
	// database".
	Name     string
	Host     string
	Port     int
	Database string
}

// Reserve reads an admin's connection string (the store's, the
// coordination database's) into the databases it reaches, one per host,
// as the relay itself connects: with pgx, from the relay's environment
// where the string leaves something out. A unix-socket host reserves
// localhost at the same port too (the same server over TCP). The error
// never quotes dsn.
func Reserve(name, dsn string) ([]ReservedDatabase, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: not a PostgreSQL connection string", name)
	}
	var out []ReservedDatabase
	add := func(host string, port uint16) {
		out = append(out, ReservedDatabase{Name: name, Host: host, Port: int(port), Database: cfg.Database})
		if strings.HasPrefix(host, "/") || strings.HasPrefix(host, "@") {
			out = append(out, ReservedDatabase{Name: name, Host: "localhost", Port: int(port), Database: cfg.Database})
		}
	}
	add(cfg.Host, cfg.Port)
	for _, f := range cfg.Fallbacks {
		add(f.Host, f.Port)
	}
	return out, nil
}

// The `ferry tenants set` flags the messages name, as the CLI spells them.
const (
	flagAllowDatabase    = "--allow-database"
	flagAllowBroker      = "--allow-broker"
	flagAllowDestination = "--allow-destination"
	flagAllowFiles       = "--allow-files"
	flagSharedDatabases  = "--shared-databases"
)

// Check judges a tenant's pipeline against its tenant's policy and returns
// every violation, each located by the pipeline's file, the line of the
// key when the spec can tell it, and the YAML path ("source.dsn",
// "sink.brokers[1]", "dead_letter.topic"). No message quotes a DSN or a
// password: databases are named host:port/database.
//
// The rules, for every component:
//   - a source or sink config must declare its endpoints
//     (plugins.Endpointer) and a sink its destinations
//     (plugins.DestinationLister): otherwise it could connect or publish
//     anywhere;
//   - each database must be allowed (Policy.Databases), never a reserved
//     one, and not one another tenant's pipeline reads unless
//     SharedDatabases — and even then never with retention on a table
//     another tenant's pipeline reads;
//   - each broker must be allowed (Policy.Brokers);
//   - no unix-socket host, ever; no file or service named in a connection
//     string, nor a field tagged `ferry:"file"`, unless AllowFiles;
//   - every destination the configs name, dead_letter.topic and the
//     canary's topic must start with an allowed prefix
//     (Policy.Destinations); a template by its fixed text before the
//     first "${". Queues and consumer groups the doctor asks the broker
//     about are destinations too;
//   - every broker object the sink creates (plugins.BrokerObjectLister: a
//     stream, exchange, queue or topic) must be named under an allowed
//     prefix too — a NATS stream under the prefix as a stream name can
//     spell it (plugins.StreamPrefix: "orders." allows "orders_events") —
//     and a sink that creates an object per routed destination (Kafka's
//     create_topics) may not be combined with a destination computed per
//     event (a transform's template), which would create objects
//     without bound;
//   - no destination is a broker's own name or holds a control character,
//     and a sink's client id (ClientIdentifier) is its tenant's (names.go).
//
// Check is for tenant pipelines only: a spec without a tenant is one
// error (the admin's pipelines are not checked: do not call Check for
// them). It connects to nothing; only another pipeline's DSN that its
// config cannot tell the endpoint of (an admin's keyword DSN) is resolved
// as the relay would, from the relay's environment (othersDatabases).
func Check(spec *pipelines.Spec, pol Policy, env CheckEnv) []*pipelines.Error {
	c := &checker{spec: spec, pol: pol, env: env}
	if spec.Tenant == "" {
		c.fail("tenant", "the pipeline has no tenant: a tenant policy judges tenant pipelines only")
		return c.errs
	}
	c.others = othersDatabases(spec, env.Others)
	c.component(spec.Source, roleSource)
	c.replication(spec.Source) // wal.go: a slot or publication is its tenant's own
	if spec.Canary != nil {
		// Where the older form sits: among the transforms, usually first.
		for _, dest := range spec.Canary.Destinations() {
			c.destination(join(spec.Canary.Path, dest.Path), dest)
		}
	}
	for _, t := range spec.Transforms {
		c.component(t, roleTransform)
	}
	c.component(spec.Sink, roleSink)
	c.objects(spec)
	c.clientID(spec.Sink.Path, spec.Sink.Config)
	if spec.DeadLetter != nil {
		c.destination("dead_letter.topic", plugins.Destination{Path: "topic", Name: spec.DeadLetter.Topic})
	}
	return c.errs
}

// AllowsDestination reports whether topic starts with one of the allowed
// destination prefixes. It allocates nothing: the pipeline calls it for
// every event it publishes (engine.Pipeline.RestrictDestinations).
func (p Policy) AllowsDestination(topic string) bool {
	if !tenantMayName(topic) {
		return false // a broker's own name (names.go)
	}
	for _, prefix := range p.Destinations {
		if strings.HasPrefix(topic, prefix) {
			return true
		}
	}
	return false
}

type role int

const (
	roleSource role = iota
	roleTransform
	roleSink
)

type checker struct {
	spec   *pipelines.Spec
	pol    Policy
	env    CheckEnv
	others []otherDatabase
	errs   []*pipelines.Error
}

// lineOf is the line of path in the spec's file when the spec keeps a
// line index (a LineOf method), else the pipeline's own line.
func (c *checker) lineOf(path string) int {
	if l, ok := any(c.spec).(interface{ LineOf(string) int }); ok {
		if n := l.LineOf(path); n > 0 {
			return n
		}
	}
	return c.spec.Line
}

func (c *checker) fail(path, format string, args ...any) {
	c.errs = append(c.errs, &pipelines.Error{File: c.spec.File, Line: c.lineOf(path), Path: path, Msg: fmt.Sprintf(format, args...)})
}

// join is the YAML path of path under prefix.
func join(prefix, path string) string {
	switch {
	case path == "":
		return prefix
	case prefix == "":
		return path
	}
	return prefix + "." + path
}

func (c *checker) component(comp pipelines.Component, r role) {
	if comp.Config == nil {
		return
	}
	tenant := c.spec.Tenant
	if !c.pol.AllowFiles {
		for _, path := range fileFields(comp.Config) {
			c.fail(join(comp.Path, path), "names a file on the relay's machine, which tenant %s may not (an admin allows it: ferry tenants set %s %s)",
				tenant, tenant, flagAllowFiles)
		}
	}
	if e, ok := comp.Config.(plugins.Endpointer); ok {
		eps, err := e.Endpoints()
		for _, err := range plugins.Flatten(err) {
			if fe, ok := err.(*plugins.FieldError); ok {
				c.fail(join(comp.Path, fe.Path), "%s", fe.Msg)
			} else {
				c.fail(comp.Path, "%v", err)
			}
		}
		for _, ep := range eps {
			c.endpoint(comp.Path, ep)
		}
	} else if r != roleTransform {
		c.fail(comp.Path, "type %s declares no endpoints (it implements no plugins.Endpointer): it could connect anywhere, "+
			"so tenant %s's pipelines may not use it", comp.Type, tenant)
	}
	if d, ok := comp.Config.(plugins.DestinationLister); ok {
		for _, dest := range d.Destinations() {
			c.destination(join(comp.Path, dest.Path), dest)
		}
	} else if r == roleSink {
		c.fail(comp.Path, "type %s declares no destinations (it implements no plugins.DestinationLister), "+
			"so tenant %s's pipelines may not use it", comp.Type, tenant)
	}
}

func (c *checker) endpoint(prefix string, ep plugins.Endpoint) {
	path := join(prefix, ep.Path)
	tenant := c.spec.Tenant
	if ep.Socket {
		c.fail(path, "a unix-socket host is never allowed for a tenant's pipeline (it reaches what listens on the relay's machine): name a TCP host")
		return
	}
	if len(ep.Files) > 0 && !c.pol.AllowFiles {
		c.fail(path, "names a file or service on the relay's machine (%s), which tenant %s may not (an admin allows it: ferry tenants set %s %s)",
			strings.Join(ep.Files, ", "), tenant, tenant, flagAllowFiles)
	}
	host := NormalHost(ep.Host)
	switch ep.Kind {
	case plugins.EndpointDatabase:
		c.database(prefix, path, host, ep)
	default:
		addr := hostPort(host, ep)
		for _, b := range c.pol.Brokers {
			if h, p, err := splitHostPort(b); err == nil && NormalHost(h) == host && p == ep.Port {
				return
			}
		}
		c.fail(path, "broker %s is not allowed for tenant %s (an admin allows it: ferry tenants set %s %s %s)",
			addr, tenant, tenant, flagAllowBroker, addr)
	}
}

// hostPort is host:port with an IPv6 host in brackets.
func hostPort(host string, ep plugins.Endpoint) string {
	ep.Host = host
	ep.Kind = plugins.EndpointBroker
	return ep.Address()
}

func (c *checker) database(prefix, path, host string, ep plugins.Endpoint) {
	tenant := c.spec.Tenant
	db := hostPort(host, ep) + "/" + ep.Database
	for _, r := range c.env.Reserved {
		if NormalHost(r.Host) == host && r.Port == ep.Port && r.Database == ep.Database {
			c.fail(path, "database %s is reserved (%s): no tenant's pipeline may read it", db, r.Name)
			return
		}
	}
	allowed, otherUser := false, false
	for _, entry := range c.pol.Databases {
		d, err := ParseDatabase(entry)
		if err != nil || d.Host != host || d.Port != ep.Port || (d.Database != "*" && d.Database != ep.Database) {
			continue
		}
		if d.User == "" || d.User == ep.User {
			allowed = true
			break
		}
		otherUser = true
	}
	switch {
	case !allowed && otherUser:
		c.fail(path, "database %s as user %s is not allowed for tenant %s (an admin allows it: ferry tenants set %s %s %s/%s)",
			db, ep.User, tenant, tenant, flagAllowDatabase, db, ep.User)
		return
	case !allowed:
		c.fail(path, "database %s is not allowed for tenant %s (an admin allows it: ferry tenants set %s %s %s)",
			db, tenant, tenant, flagAllowDatabase, db)
		return
	}
	shared, sharedTable := false, ""
	for _, o := range c.others {
		if o.host != host || o.port != ep.Port || o.database != ep.Database {
			continue
		}
		shared = true
		if ep.Retention && sameTable(o.table, ep.Table) {
			sharedTable = ep.Table
		}
	}
	switch {
	case shared && !c.pol.SharedDatabases:
		c.fail(path, "database %s is read by a pipeline of another tenant, which tenant %s may not read (an admin allows it: ferry tenants set %s %s)",
			db, tenant, tenant, flagSharedDatabases)
	case sharedTable != "":
		c.fail(join(prefix, ep.RetentionPath), "removes rows of table %s of database %s (retention, or the poll source's claims), "+
			"which a pipeline of another tenant reads: never allowed, even with shared databases", sharedTable, db)
	}
}

// sameTable reports whether two outbox tables may be the same table: an
// unqualified name is whichever schema the search_path finds first, so it
// may be that name in any schema.
func sameTable(a, b string) bool {
	if a == b {
		return true
	}
	_, an, aq := strings.Cut(a, ".")
	_, bn, bq := strings.Cut(b, ".")
	switch {
	case aq && !bq:
		return an == b
	case bq && !aq:
		return bn == a
	}
	return false
}

func (c *checker) destination(path string, d plugins.Destination) {
	if c.reservedName(path, d) {
		return
	}
	tenant := c.spec.Tenant
	fixed := d.Fixed()
	if c.pol.AllowsDestination(fixed) {
		return
	}
	switch {
	case !d.Template || fixed == d.Name:
		c.fail(path, "destination %q is not allowed for tenant %s (an admin allows a prefix of it: ferry tenants set %s %s PREFIX)",
			d.Name, tenant, tenant, flagAllowDestination)
	case fixed == "":
		c.fail(path, "destination pattern %q starts with a placeholder, so its events could go anywhere, which tenant %s may not "+
			"(write an allowed prefix before the first ${)", d.Name, tenant)
	default:
		c.fail(path, "destination pattern %q is not allowed for tenant %s: its fixed part %q must start with an allowed prefix "+
			"(an admin allows one: ferry tenants set %s %s PREFIX)", d.Name, tenant, fixed, tenant, flagAllowDestination)
	}
}

// objects checks the names of the broker objects the sink creates, and
// that it creates none per event when events are routed by a template.
func (c *checker) objects(spec *pipelines.Spec) {
	ol, ok := spec.Sink.Config.(plugins.BrokerObjectLister)
	if !ok {
		return
	}
	tenant := spec.Tenant
	// An object that is also a destination (a RabbitMQ exchange) was
	// judged as one, by the same rule: one message for it is enough.
	judged := map[plugins.Destination]bool{}
	if d, ok := spec.Sink.Config.(plugins.DestinationLister); ok {
		for _, dest := range d.Destinations() {
			judged[plugins.Destination{Path: dest.Path, Name: dest.Name}] = !dest.Template
		}
	}
	for _, o := range ol.BrokerObjects() {
		path := join(spec.Sink.Path, o.Path)
		if judged[plugins.Destination{Path: o.Path, Name: o.Name}] && o.Kind != plugins.ObjectStream {
			// Checked by destination.
		} else if !c.pol.AllowsObject(o.Kind, o.Name) {
			how := ""
			if o.Kind == plugins.ObjectStream {
				how = `; a stream name cannot hold ".", so a prefix matches it with "_" for each such character ("orders." allows "orders_events")`
			}
			c.fail(path, "%s %q is not under a destination prefix allowed for tenant %s, so its pipelines may not create it%s "+
				"(an admin allows a prefix of it: ferry tenants set %s %s PREFIX)", o.Kind, o.Name, tenant, how, tenant, flagAllowDestination)
		}
		if o.PerEvent == "" {
			continue
		}
		for _, t := range spec.Transforms {
			d, ok := t.Config.(plugins.DestinationLister)
			if !ok {
				continue
			}
			for _, dest := range d.Destinations() {
				if dest.Template && dest.Fixed() != dest.Name {
					c.fail(join(spec.Sink.Path, o.PerEvent), "creates a %s for every destination an event is routed to, and %s is computed per event (%q): "+
						"a tenant's pipeline may not create %ss without bound (route to fixed %ss, or have an admin create them and drop %s)",
						o.Kind, join(t.Path, dest.Path), dest.Name, o.Kind, o.Kind, o.PerEvent)
				}
			}
		}
	}
}

// AllowsObject reports whether a broker object of kind may be named name:
// it starts with an allowed destination prefix, for a NATS stream with the
// prefix as a stream name spells it (plugins.StreamPrefix).
func (p Policy) AllowsObject(kind plugins.ObjectKind, name string) bool {
	if kind != plugins.ObjectStream {
		return p.AllowsDestination(name)
	}
	for _, prefix := range p.Destinations {
		if strings.HasPrefix(name, plugins.StreamPrefix(prefix)) {
			return true
		}
	}
	return false
}

// otherDatabase is a database (and table) a pipeline of another tenant
// reads.
type otherDatabase struct {
	host     string
	port     int
	database string
	table    string
}

// othersDatabases lists the databases the pipelines of every other tenant
// (and the admin's) read. A source whose endpoints cannot be read from its
// config alone (an admin's keyword DSN) is read as the relay connects it,
// by pgx, with the environment, but never with a connection parameter that
// reads a file: the DSN may be a tenant's.
func othersDatabases(spec *pipelines.Spec, others []*pipelines.Spec) []otherDatabase {
	var out []otherDatabase
	for _, o := range others {
		if o == nil || o == spec || o.Tenant == spec.Tenant {
			continue
		}
		for _, comp := range append([]pipelines.Component{o.Source, o.Sink}, o.Transforms...) {
			out = append(out, componentDatabases(comp.Config)...)
		}
	}
	return out
}

func componentDatabases(cfg plugins.Config) []otherDatabase {
	if cfg == nil {
		return nil
	}
	var out []otherDatabase
	if e, ok := cfg.(plugins.Endpointer); ok {
		if eps, err := e.Endpoints(); err == nil {
			for _, ep := range eps {
				if ep.Kind == plugins.EndpointDatabase {
					out = append(out, otherDatabase{host: NormalHost(ep.Host), port: ep.Port, database: ep.Database, table: ep.Table})
				}
			}
			return out
		}
	}
	o, ok := cfg.(plugins.OutboxSource)
	if !ok {
		return nil
	}
	t := o.OutboxTable()
	pc, err := pgconn.ParseConfigWithOptions(t.DSN, pgconn.ParseConfigOptions{ConnStringAllowedKeys: noFileKeys})
	if err != nil {
		return nil // a pipeline that cannot connect reads nothing
	}
	hosts := []*pgconn.FallbackConfig{{Host: pc.Host, Port: pc.Port}}
	hosts = append(hosts, pc.Fallbacks...)
	for _, h := range hosts {
		host := NormalHost(h.Host)
		if strings.HasPrefix(h.Host, "/") {
			host = "localhost" // a socket: this machine's server
		}
		out = append(out, otherDatabase{host: host, port: int(h.Port), database: pc.Database, table: t.Table})
	}
	return out
}

// noFileKeys are the connection-string keys ParseConfig may read in
// another pipeline's DSN: every libpq key that names no file or service.
var noFileKeys = []string{
	"host", "hostaddr", "port", "dbname", "user", "password", "connect_timeout",
	"client_encoding", "options", "application_name", "fallback_application_name",
	"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
	"tcp_user_timeout", "replication", "gssencmode", "sslmode", "sslnegotiation",
	"sslcompression", "sslsni", "sslcertmode", "requirepeer", "ssl_min_protocol_version",
	"ssl_max_protocol_version", "min_protocol_version", "max_protocol_version",
	"krbsrvname", "gsslib", "gssdelegation", "target_session_attrs", "load_balance_hosts",
	"channel_binding", "require_auth", "search_path", "statement_timeout", "timezone",
}
