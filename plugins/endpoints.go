package plugins

import (
	"net"
	"net/url"
	"strconv"
	"strings"
)

// EndpointKind says what is at the other end of an Endpoint.
type EndpointKind string

// Endpoint kinds: a policy allows databases and brokers in separate lists.
const (
	// EndpointDatabase is a PostgreSQL database (host, port and database).
	EndpointDatabase EndpointKind = "database"
	// EndpointBroker is a message broker (host and port).
	EndpointBroker EndpointKind = "broker"
)

// Endpoint is a network destination a component config connects to, as the
// config names it: read from the configuration alone, never from the
// process environment or a file, so that it is the endpoint whatever server
// runs the pipeline.
type Endpoint struct {
	// Path is the key that names it, relative to the component: "dsn",
	// "brokers[1]", "url".
	Path string
	// Kind is what is there: EndpointDatabase or EndpointBroker.
	Kind EndpointKind
	// Scheme is the protocol as written or implied: postgres, nats, tls,
	// kafka, amqp, amqps, redis, rediss.
	Scheme string
	// Host is the host name or address as written (without brackets for
	// IPv6), or the socket path when Socket is set.
	Host string
	// Port is the TCP port, the scheme's default (DefaultPort) when the
	// value names none.
	Port int
	// Database is the database name; databases only.
	Database string
	// User is the user the component connects as; databases only.
	User string
	// Table is the table the component reads, "schema.name" when the
	// config names the schema, else "name" alone (the server's search_path
	// decides: treat it as that name in any schema); databases only.
	Table string
	// Retention reports that the component deletes rows of Table
	// (`retention:` set, poll's `on_delivered: delete`), and RetentionPath
	// the key that turns it on ("retention", "on_delivered").
	Retention     bool
	RetentionPath string
	// Files are the parts of the value that name a file or a service
	// definition on the server the component runs on, by their parameter
	// name ("sslrootcert", "passfile", "service", "certfile"); empty when
	// none does.
	Files []string
	// Socket reports that the host is a unix-domain socket (a path, or an
	// abstract "@name"): a connection that reaches whatever listens on the
	// relay's own machine.
	Socket bool
}

// Address is "host:port" (IPv6 hosts in brackets); for a database,
// "host:port/database". It never holds a user or password.
func (e Endpoint) Address() string {
	a := net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	if e.Kind == EndpointDatabase {
		a += "/" + e.Database
	}
	return a
}

// Endpointer is implemented by component configs that connect somewhere:
// Endpoints lists every database and broker the component would connect
// to. It reads the config only (no environment, no files, no I/O) and
// returns an error — *FieldErrors located by the key — for a value it
// cannot tell the endpoint of, such as a connection string whose server
// depends on the environment it runs in.
type Endpointer interface {
	Endpoints() ([]Endpoint, error)
}

// Destination is a topic, subject, exchange or routing key a component
// config names.
type Destination struct {
	// Path is the key that names it, relative to the component: "topic",
	// "create_stream.subjects[0]", "event_type_topics.OrderPlaced".
	Path string
	// Name is the destination as written.
	Name string
	// Template reports that Name is a pattern filled per event ("orders.${route}"):
	// only its literal text before the first "${" is known before events flow.
	Template bool
}

// Fixed is what is known of the destination before events flow: Name, or,
// for a template, its text before the first "${".
func (d Destination) Fixed() string {
	if !d.Template {
		return d.Name
	}
	if i := strings.Index(d.Name, "${"); i >= 0 {
		return d.Name[:i]
	}
	return d.Name
}

// DestinationLister is implemented by sink and transform configs that name
// destinations: the sink's default topic, subject, exchange or routing key,
// a router's topic patterns, the canary's topic.
type DestinationLister interface {
	Destinations() []Destination
}

// ObjectKind is the kind of a BrokerObject.
type ObjectKind string

// Broker object kinds.
const (
	// ObjectStream is a NATS JetStream stream. Its name cannot hold ".",
	// "*", ">" or spaces, so a policy compares it with each allowed
	// destination prefix written with "_" for every character a stream
	// name cannot hold (StreamPrefix).
	ObjectStream ObjectKind = "stream"
	// ObjectExchange is a RabbitMQ exchange.
	ObjectExchange ObjectKind = "exchange"
	// ObjectQueue is a RabbitMQ queue.
	ObjectQueue ObjectKind = "queue"
	// ObjectTopic is a Kafka topic.
	ObjectTopic ObjectKind = "topic"
)

// BrokerObject is a stream, exchange, queue or topic a sink creates or
// declares on its broker, named by its config.
type BrokerObject struct {
	// Path is the key that names it, relative to the component:
	// "create_stream.name".
	Path string
	// Kind is what it is.
	Kind ObjectKind
	// Name is the object's name as written.
	Name string
	// PerEvent, when set, is the key ("create_topics") that makes the
	// sink also create an object of this kind for every destination an
	// event is routed to: a destination computed per event (a template)
	// would make it create objects without bound.
	PerEvent string
}

// BrokerObjectLister is implemented by sink configs that create or
// declare broker objects: the tenant policy checks that a tenant's
// pipeline creates objects only under its allowed destination prefixes.
type BrokerObjectLister interface {
	BrokerObjects() []BrokerObject
}

// StreamPrefix is prefix as a NATS stream name can start with it: every
// character a stream name cannot hold (anything but letters, digits, "_"
// and "-") written as "_". An allowed prefix "orders." allows the stream
// "orders_events".
func StreamPrefix(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, prefix)
}

// ReasonDestinationNotAllowed is the dead-letter reason of an event whose
// topic is outside the destinations its tenant may publish to: it is never
// published there.
const ReasonDestinationNotAllowed = "destination_not_allowed"

// DefaultPort is the port a scheme implies when a value names none: 5432
// for PostgreSQL, 4222 for NATS (80 and 443 over websockets), 9092 for
// Kafka, 5672 for AMQP, 5671 for AMQPS, 6379 for Redis; 0 for a scheme it
// does not know.
func DefaultPort(scheme string) int {
	switch scheme {
	case "postgres", "postgresql":
		return 5432
	case "nats", "tls":
		return 4222
	case "ws":
		return 80
	case "wss":
		return 443
	case "kafka":
		return 9092
	case "amqp":
		return 5672
	case "amqps":
		return 5671
	case "redis", "rediss":
		return 6379
	}
	return 0
}

// URLEndpoint reads a broker's URL, as net/url (and so the NATS, AMQP and
// Redis clients) splits it, into an Endpoint at path. schemes lists the
// schemes the component accepts. It never quotes the URL in its error: a
// malformed one may hold a password in the wrong place.
func URLEndpoint(path, raw string, schemes ...string) (Endpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Endpoint{}, FieldErrorf(path, "not a URL like %s://host:port", schemes[0])
	}
	known := false
	for _, s := range schemes {
		known = known || u.Scheme == s
	}
	if !known {
		return Endpoint{}, FieldErrorf(path, "want a %s URL", strings.Join(schemes, "://, ")+"://")
	}
	if u.Hostname() == "" {
		return Endpoint{}, FieldErrorf(path, "names no host")
	}
	e := Endpoint{Path: path, Kind: EndpointBroker, Scheme: u.Scheme, Host: u.Hostname(), Port: DefaultPort(u.Scheme)}
	if p := u.Port(); p != "" {
		if e.Port, err = strconv.Atoi(p); err != nil || e.Port < 1 || e.Port > 65535 {
			return Endpoint{}, FieldErrorf(path, "port is not a number from 1 to 65535")
		}
	}
	return e, nil
}

// HostPortEndpoint reads "host:port" (a Kafka broker) into a broker
// Endpoint at path; a missing port is the scheme's default.
func HostPortEndpoint(path, hostport, scheme string) (Endpoint, error) {
	host, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	} else if strings.Count(hostport, ":") > 0 && !strings.HasPrefix(hostport, "[") {
		return Endpoint{}, FieldErrorf(path, "%q is not host:port", hostport)
	}
	host = strings.Trim(host, "[]")
	if host == "" {
		return Endpoint{}, FieldErrorf(path, "names no host")
	}
	e := Endpoint{Path: path, Kind: EndpointBroker, Scheme: scheme, Host: host, Port: DefaultPort(scheme)}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return Endpoint{}, FieldErrorf(path, "port is not a number from 1 to 65535")
		}
		e.Port = n
	}
	return e, nil
}

// ControlCharacter is the index of the first control character (a byte
// below 0x20, or 0x7f) in name, -1 when there is none. A CR or LF in a
// NATS subject ends the protocol line it is sent on and starts another
// command; no broker's names need one, so none is accepted anywhere.
func ControlCharacter(name string) int {
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] == 0x7f {
			return i
		}
	}
	return -1
}
