package pgsource

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/plugins"
)

func TestDatabaseEndpoints(t *testing.T) {
	db := func(host string, port int, database, user string) plugins.Endpoint {
		return plugins.Endpoint{Path: "dsn", Kind: plugins.EndpointDatabase, Scheme: "postgres",
			Host: host, Port: port, Database: database, User: user, Table: "outbox"}
	}
	with := func(e plugins.Endpoint, f func(*plugins.Endpoint)) plugins.Endpoint { f(&e); return e }
	for _, c := range []struct {
		name string
		dsn  string
		want []plugins.Endpoint
		err  string // a part of the error at "dsn"
	}{
		{name: "url", dsn: "postgres://orders:s3cret@db.internal:6432/orders?sslmode=require",
			want: []plugins.Endpoint{db("db.internal", 6432, "orders", "orders")}},
		{name: "postgresql scheme, default port", dsn: "postgresql://u@db/orders",
			want: []plugins.Endpoint{db("db", 5432, "orders", "u")}},
		{name: "ipv6", dsn: "postgres://u@[::1]:5433/orders",
			want: []plugins.Endpoint{db("::1", 5433, "orders", "u")}},
		{name: "percent-encoded user and database", dsn: "postgres://te%40m:p%40ss@db/my%20db",
			want: []plugins.Endpoint{db("db", 5432, "my db", "te@m")}},
		{name: "hosts list, one port for all", dsn: "postgres://u@a,b:6000/orders",
			want: []plugins.Endpoint{db("a", 5432, "orders", "u"), db("b", 6000, "orders", "u")}},
		{name: "query parameters win, as in pgx", dsn: "postgres://u@a/orders?host=b&port=7000&dbname=other&user=v",
			want: []plugins.Endpoint{db("b", 7000, "other", "v")}},
		// libpq ends the user info at the first '@': the host is
		// "evil@good" (which does not resolve), not "good" as net/url has it.
		{name: "user info ends at the first @", dsn: "postgres://u:p@evil@good/orders",
			want: []plugins.Endpoint{db("evil@good", 5432, "orders", "u")}},
		{name: "file parameters", dsn: "postgres://u@db/orders?sslrootcert=/etc/ssl/ca.pem&sslkey=/k&passfile=/p&service=s",
			want: []plugins.Endpoint{with(db("db", 5432, "orders", "u"), func(e *plugins.Endpoint) {
				e.Files = []string{"sslrootcert", "sslkey", "passfile", "service"}
			})}},
		{name: "sslrootcert=system names no file", dsn: "postgres://u@db/orders?sslrootcert=system&sslmode=verify-full",
			want: []plugins.Endpoint{db("db", 5432, "orders", "u")}},
		{name: "socket in the host parameter", dsn: "postgres://u@localhost/orders?host=/var/run/postgresql",
			want: []plugins.Endpoint{with(db("/var/run/postgresql", 5432, "orders", "u"), func(e *plugins.Endpoint) { e.Socket = true })}},
		{name: "percent-encoded socket host", dsn: "postgres://u@%2Ftmp/orders",
			want: []plugins.Endpoint{with(db("/tmp", 5432, "orders", "u"), func(e *plugins.Endpoint) { e.Socket = true })}},
		{name: "abstract socket", dsn: "postgres://u@%40pg/orders",
			want: []plugins.Endpoint{with(db("@pg", 5432, "orders", "u"), func(e *plugins.Endpoint) { e.Socket = true })}},

		{name: "keyword DSN", dsn: "host=db user=u dbname=orders", err: "not a URL postgres://user@host[:port]/database"},
		{name: "other scheme", dsn: "mysql://u@db/orders", err: "not a URL"},
		{name: "no user", dsn: "postgres://db/orders", err: "names no user"},
		{name: "no database", dsn: "postgres://u@db", err: "names no database"},
		{name: "empty database", dsn: "postgres://u@db/", err: "names no database"},
		{name: "no host", dsn: "postgres://u@/orders", err: "names no host"},
		{name: "empty host in a list", dsn: "postgres://u@a,/orders", err: "names an empty host"},
		{name: "empty host parameter", dsn: "postgres://u@a/orders?host=", err: "names an empty host"},
		{name: "bad port", dsn: "postgres://u@db:http/orders", err: "port"},
		{name: "ports do not match hosts", dsn: "postgres://u@a:1,b:2/orders?port=1,2,3", err: "3 ports for 2 hosts"},
		{name: "bad escape", dsn: "postgres://u@db/or%zzders", err: "not well encoded"},
		{name: "NUL", dsn: "postgres://u@db/orders\x00", err: "NUL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := Outbox{DSN: c.dsn, Table: "outbox"}
			got, err := o.DatabaseEndpoints("")
			if c.err != "" {
				var fe *plugins.FieldError
				if !errors.As(err, &fe) || fe.Path != "dsn" || !strings.Contains(fe.Msg, c.err) {
					t.Fatalf("error %v, want one at dsn containing %q", err, c.err)
				}
				if strings.Contains(err.Error(), c.dsn) || (strings.Contains(c.dsn, "s3cret") && strings.Contains(err.Error(), "s3cret")) {
					t.Errorf("error %q quotes the DSN", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("endpoints\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// The endpoint is the DSN's alone: the libpq variables pgx would fill in
// from the relay's environment (PGHOST, PGPORT, PGDATABASE, PGUSER,
// PGPASSWORD, PGSERVICEFILE…) change nothing, and a DSN that leaves to them
// what it does not say is still refused.
func TestDatabaseEndpointsIgnoreTheEnvironment(t *testing.T) {
	dsns := []string{"postgres://u@db/orders", "postgres://u:pw@db:6432/orders?sslmode=disable", "postgres://db/orders", "dbname=orders"}
	type result struct {
		eps []plugins.Endpoint
		err string
	}
	read := func() []result {
		var out []result
		for _, dsn := range dsns {
			o := Outbox{DSN: dsn, Table: "public.outbox"}
			eps, err := o.DatabaseEndpoints("retention")
			r := result{eps: eps}
			if err != nil {
				r.err = err.Error()
			}
			out = append(out, r)
		}
		return out
	}
	before := read()
	for k, v := range map[string]string{"PGHOST": "elsewhere", "PGPORT": "7777", "PGDATABASE": "postgres", "PGUSER": "admin",
		"PGPASSWORD": "server-secret", "PGSSLROOTCERT": "/etc/server.pem", "PGSERVICEFILE": "/etc/pg_service.conf", "PGSERVICE": "admin"} {
		t.Setenv(k, v)
	}
	after := read()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("the environment changed the endpoints:\nwithout %+v\n   with %+v", before, after)
	}
	if before[0].err != "" || before[0].eps[0].Host != "db" || before[0].eps[0].Port != 5432 || before[0].eps[0].User != "u" ||
		before[0].eps[0].Database != "orders" || before[0].eps[0].Table != "public.outbox" || !before[0].eps[0].Retention ||
		before[0].eps[0].RetentionPath != "retention" {
		t.Errorf("postgres://u@db/orders: %+v", before[0])
	}
	if before[2].err == "" || before[3].err == "" {
		t.Errorf("a DSN without user, and a keyword DSN, must be refused: %+v", before[2:])
	}
	for _, r := range after {
		if strings.Contains(r.err, "server-secret") || strings.Contains(r.err, "elsewhere") {
			t.Errorf("error %q shows the environment", r.err)
		}
	}
}

// FuzzDatabaseEndpointsAgreeWithPgx: whatever DSN the endpoint reader
// accepts names the servers pgx dials, in order, with the same database
// and user — read by pgx with nothing in the environment to fill in. (A
// reader that split URLs another way, as net/url does, would let a DSN
// name an allowed server to the policy and dial another.)
func FuzzDatabaseEndpointsAgreeWithPgx(f *testing.F) {
	for _, s := range []string{
		"postgres://u@db/orders", "postgresql://u:p@db:6432/orders?sslmode=disable",
		"postgres://u:p@evil@good/orders", "postgres://u@a,b:6000/orders", "postgres://u@a:1,b:2/orders",
		"postgres://u@[::1]:5433/orders", "postgres://u@a/orders?host=b&port=7000&dbname=other&user=v",
		"postgres://te%40m@db/my%20db", "postgres://u@db/orders?x=@other/y", "postgres://u@db?dbname=orders",
		"postgres://u@db:5432,/orders", "postgres://u@ db /orders", "postgres://u@db/orders#frag",
	} {
		f.Add(s)
	}
	for _, k := range []string{"PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE", "PGSERVICE",
		"PGSERVICEFILE", "PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGTARGETSESSIONATTRS"} {
		f.Setenv(k, "")
	}
	f.Setenv("HOME", f.TempDir()) // no ~/.pgpass, no ~/.postgresql certificates
	f.Fuzz(func(t *testing.T, dsn string) {
		eps, err := ParseDSNEndpoints(dsn)
		if err != nil || len(eps) == 0 || len(eps[0].Files) > 0 {
			return // refused, or pgx would read files
		}
		for _, e := range eps {
			if e.Socket {
				return // pgx dials a socket: nothing to compare over TCP
			}
		}
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			return // pgx refuses it: nothing is dialled
		}
		got := []string{}
		for _, e := range eps {
			got = append(got, fmt.Sprintf("%s:%d/%s/%s", e.Host, e.Port, e.Database, e.User))
		}
		want := []string{fmt.Sprintf("%s:%d/%s/%s", cfg.Host, cfg.Port, cfg.Database, cfg.User)}
		for _, fb := range cfg.Fallbacks {
			want = append(want, fmt.Sprintf("%s:%d/%s/%s", fb.Host, fb.Port, cfg.Database, cfg.User))
		}
		if !reflect.DeepEqual(dedupe(got), dedupe(want)) {
			t.Errorf("%q: endpoints %v, pgx dials %v", dsn, got, want)
		}
	})
}

// dedupe drops repeats: pgx lists a host once per TLS attempt (sslmode
// prefer tries TLS, then plain).
func dedupe(s []string) []string {
	var out []string
	for _, v := range s {
		if len(out) == 0 || out[len(out)-1] != v {
			out = append(out, v)
		}
	}
	return out
}
