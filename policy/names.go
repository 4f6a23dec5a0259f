package policy

import (
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// Names a broker keeps for itself, and names with control characters, are
// no tenant's destination whatever its prefixes allow: an admin who
// allows the prefix "" (everything) or "_" did not mean to hand out the
// brokers' own namespaces. A destination here is anything a tenant's
// pipeline makes Ferry name to a broker — a topic, subject, exchange or
// routing key it publishes to, and a queue or consumer group the doctor
// and lag reports ask the broker about (a depth, or "no such queue", is a
// fact about whoever owns the name).

// reservedPrefix is a namespace a broker keeps for itself.
type reservedPrefix struct {
	prefix string
	// everyone reports that no pipeline, the admin's included, may name
	// it: a message there is a command to the broker or rewrites its
	// state. The sinks' Validate refuses these for their own broker.
	everyone bool
	// why says whose it is, in the error.
	why string
}

// reservedPrefixes are the brokers' own namespaces. The admin may publish
// to the others: RabbitMQ's amq.topic is an ordinary shared exchange, a
// JetStream key-value bucket is written by publishing to $KV.<bucket>.
// <key>; but both are shared by every tenant of the broker.
var reservedPrefixes = []reservedPrefix{
	{"$JS.", true, "NATS JetStream's API ($JS.API.STREAM.DELETE... deletes a stream)"},
	{"$SYS.", true, "the NATS system account's events and requests"},
	{"__consumer_offsets", true, "Kafka's consumer group offsets"},
	{"__transaction_state", true, "Kafka's transaction coordinator state"},
	{"_schemas", true, "the schema registry's own topic"},
	{"$", false, "NATS system subjects ($KV., $O., $MQTT., $JSC.: key-value buckets, object stores, bridges)"},
	{"_INBOX.", false, "NATS request-reply inboxes, where other clients' replies arrive"},
	{"amq.", false, "RabbitMQ's own exchanges and queues (amq.topic, amq.gen-...), shared by every user of the broker"},
	{"__", false, "Kafka's internal topics"},
	{"_confluent", false, "Confluent Platform's internal topics"},
}

// ForbiddenName says why no pipeline, the admin's included, may publish
// to name — a control character, or a broker namespace whose messages are
// commands to the broker — and "" when it may. It allocates nothing
// unless it refuses: the engine calls it for every event it publishes.
func ForbiddenName(name string) string {
	if i := plugins.ControlCharacter(name); i >= 0 {
		return fmt.Sprintf("has a control character (byte 0x%02x at %d), which no destination may have", name[i], i)
	}
	for _, r := range reservedPrefixes {
		if r.everyone && strings.HasPrefix(name, r.prefix) {
			return fmt.Sprintf("is reserved: %s is %s", r.prefix, r.why)
		}
	}
	return ""
}

// reservedForTenants says why no tenant's pipeline may name name, "" when
// it may (as far as names go: its prefixes decide the rest).
func reservedForTenants(name string) string {
	if why := ForbiddenName(name); why != "" {
		return why
	}
	for _, r := range reservedPrefixes {
		if strings.HasPrefix(name, r.prefix) {
			return fmt.Sprintf("is reserved: %s is %s", r.prefix, r.why)
		}
	}
	return ""
}

// tenantMayName reports whether a tenant's pipeline may name name at all;
// AllowsDestination calls it for every event, so it allocates nothing.
func tenantMayName(name string) bool {
	if plugins.ControlCharacter(name) >= 0 {
		return false
	}
	for _, r := range reservedPrefixes {
		if strings.HasPrefix(name, r.prefix) {
			return false
		}
	}
	return true
}

// reservedName fails a destination of a tenant's pipeline that is a
// broker's own or has a control character, and reports whether it did.
// A template is judged by its whole text for control characters and by
// its fixed part for namespaces (the rest is judged per event, at
// publish).
func (c *checker) reservedName(path string, d plugins.Destination) bool {
	if i := plugins.ControlCharacter(d.Name); i >= 0 {
		c.fail(path, "%q has a control character (byte 0x%02x at %d), which no destination may have", d.Name, d.Name[i], i)
		return true
	}
	if why := reservedForTenants(d.Fixed()); why != "" {
		c.fail(path, "%q %s: no tenant's pipeline may name it", d.Name, why)
		return true
	}
	return false
}

// ClientIdentifier is implemented by sink configs that name the client to
// the broker, as Kafka's client.id: brokers apply quotas (bytes and
// requests per second) and log per client id, so a tenant who sets
// another's id shares — and can use up — the other's quota. ClientIdentity
// is the id as configured, "" when left to the default (which the sink
// derives from the pipeline's tenant), and the key that names it.
type ClientIdentifier interface {
	ClientIdentity() (path, id string)
}

// clientID fails a client id of a tenant's pipeline that is not its
// tenant's: the tenant's name itself or the name followed by a dot. A dot
// never occurs in a tenant name, so "team-b." cannot be the start of
// tenant team-bb's ids.
func (c *checker) clientID(prefix string, cfg any) {
	ci, ok := cfg.(ClientIdentifier)
	if !ok {
		return
	}
	path, id := ci.ClientIdentity()
	tenant := c.spec.Tenant
	if id == "" || id == tenant || strings.HasPrefix(id, tenant+".") {
		return
	}
	c.fail(join(prefix, path), "client id %q is not tenant %s's: brokers apply quotas per client id, so a tenant's start with its name "+
		"(%q, or leave it out for the default %s.ferry)", id, tenant, tenant+".", tenant)
}
