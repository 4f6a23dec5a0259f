// Package policy is what an admin allows a tenant's pipelines to reach: the
// database and broker endpoints, the destination prefixes, and whether they
// may name files on the server. A tenant pipeline is a store pipeline with a
// tenant; file pipelines and store pipelines without a tenant are the
// admin's own and are not checked.
//
// It knows components only through the plugins API and pipeline specs; it
// must not import the store, the HTTP API, the CLI, a concrete component or
// lab code.
package policy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// Policy is one tenant's allow-lists. The zero Policy allows no endpoint:
// a tenant's pipeline may connect only where an admin said it may.
type Policy struct {
	// Databases are the PostgreSQL databases the tenant's sources may read,
	// each "host:port/database" or "host:port/database/user"; "*" as the
	// database allows every database of that server. Default: none.
	Databases []string `json:"databases,omitempty" yaml:"databases"`
	// Brokers are the broker endpoints the tenant's sinks may publish to,
	// each "host:port". Default: none.
	Brokers []string `json:"brokers,omitempty" yaml:"brokers"`
	// Destinations are the topic, subject, exchange and routing-key prefixes
	// the tenant may publish to ("orders." allows "orders.created"); an
	// empty prefix "" allows every destination. Default: none.
	Destinations []string `json:"destinations,omitempty" yaml:"destinations"`
	// AllowFiles lets the tenant's pipelines name files on the server (TLS
	// certificates and keys, NATS credentials, sslrootcert in a DSN).
	// Default false.
	AllowFiles bool `json:"allow_files,omitempty" yaml:"allow_files"`
	// SharedDatabases lets the tenant read a database another tenant's
	// pipeline reads (never with retention on a table another tenant's
	// pipeline reads). Default false.
	SharedDatabases bool `json:"shared_databases,omitempty" yaml:"shared_databases"`
}

// Validate reports every entry that is not of its list's form, by path
// ("policy.databases[0]").
func (p Policy) Validate() error {
	var probs plugins.Problems
	for i, d := range p.Databases {
		if _, err := ParseDatabase(d); err != nil {
			probs.Add(fmt.Sprintf("databases[%d]", i), "%v", err)
		}
	}
	for i, b := range p.Brokers {
		if _, _, err := splitHostPort(b); err != nil {
			probs.Add(fmt.Sprintf("brokers[%d]", i), "%v", err)
		}
	}
	for i, d := range p.Destinations {
		// A prefix is compared as text: "orders.*" would allow only names
		// starting with "orders.*", which is never what was meant.
		if strings.ContainsAny(d, "*>") || strings.Contains(d, "${") {
			probs.Add(fmt.Sprintf("destinations[%d]", i), "%q: want a prefix such as \"orders.\", not a pattern", d)
		}
	}
	return probs.Err()
}

// Database is one allowed database entry.
type Database struct {
	Host string
	Port int
	// Database is "*" for any database of the server.
	Database string
	// User is empty for any user.
	User string
}

// ParseDatabase reads "host:port/database[/user]".
func ParseDatabase(s string) (Database, error) {
	hp, rest, ok := strings.Cut(s, "/")
	if !ok || rest == "" {
		return Database{}, fmt.Errorf("%q: want host:port/database or host:port/database/user", s)
	}
	host, port, err := splitHostPort(hp)
	if err != nil {
		return Database{}, err
	}
	db, user, _ := strings.Cut(rest, "/")
	if db == "" || strings.Contains(user, "/") {
		return Database{}, fmt.Errorf("%q: want host:port/database or host:port/database/user", s)
	}
	return Database{Host: NormalHost(host), Port: port, Database: db, User: user}, nil
}

// splitHostPort reads "host:port"; the port is required.
func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", 0, fmt.Errorf("%q: want host:port", s)
	}
	host := strings.Trim(s[:i], "[]")
	port, err := strconv.Atoi(s[i+1:])
	if err != nil || port < 1 || port > 65535 || host == "" || strings.ContainsAny(host, "/@ ") {
		return "", 0, fmt.Errorf("%q: want host:port", s)
	}
	return host, port, nil
}

// NormalHost lowercases a host name and folds the loopback names into one,
// so "localhost:5432" and "127.0.0.1:5432" are the same server.
func NormalHost(h string) string {
	h = strings.ToLower(strings.Trim(h, "[]"))
	switch h {
	case "localhost", "127.0.0.1", "::1", "0:0:0:0:0:0:0:1":
		return "localhost"
	}
	return h
}
