package pgsource

import (
	"errors"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/plugins"
)

// DatabaseEndpoints is the database the source's DSN names, one endpoint
// per host of a multi-host URL, for the tenant policy (plugins.Endpointer).
// retentionPath, when not empty, is the key that makes the source delete or
// claim the table's rows ("retention", "on_delivered").
//
// It reads the DSN alone. pgx's ParseConfig is not used because it fills
// what the DSN leaves out from the relay's environment and files (PGHOST,
// PGDATABASE, PGUSER, ~/.pgpass, pg_service.conf), so the endpoint would
// depend on the server. Nor is net/url: it splits a connection URI
// differently from libpq and pgx (the user info ends at the last '@' for
// net/url, the first for libpq; libpq has host lists and decodes hosts
// as a unit), so it could name another server than the one pgx dials. The
// URI is read as pgx reads it (parseConnURI), and only a URI naming its
// user, host and database is accepted: an error at "dsn" otherwise.
func (o *Outbox) DatabaseEndpoints(retentionPath string) ([]plugins.Endpoint, error) {
	eps, err := ParseDSNEndpoints(o.DSN)
	if err != nil {
		return nil, err
	}
	for i := range eps {
		eps[i].Table = o.Table
		eps[i].Retention = retentionPath != ""
		eps[i].RetentionPath = retentionPath
	}
	return eps, nil
}

// dsnFileParams are the connection parameters that make the client read a
// file on the relay's machine, or a service definition from one; "sslrootcert=system"
// (the system's roots) names none.
var dsnFileParams = []string{"sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "sslkeylogfile",
	"passfile", "service", "servicefile"}

// uriForm is the form a DSN must have to tell its endpoint (a password
// may follow the user); the messages quote it, never the DSN. It is not
// written with a password, which redaction would mask.
const uriForm = "postgres://user@host[:port]/database"

// ParseDSNEndpoints reads a PostgreSQL connection URI into database
// endpoints at path "dsn" (see DatabaseEndpoints). Errors are
// *plugins.FieldError at "dsn" and never quote the DSN.
func ParseDSNEndpoints(dsn string) ([]plugins.Endpoint, error) {
	fail := func(format string, args ...any) ([]plugins.Endpoint, error) {
		return nil, plugins.FieldErrorf("dsn", format, args...)
	}
	scheme, _, isURI := strings.Cut(dsn, "://")
	if !isURI || (scheme != "postgres" && scheme != "postgresql") {
		return fail("not a URL %s: the server a keyword/value connection string reaches "+
			"depends on the relay's environment (PGHOST, PGUSER, PGDATABASE, service files)", uriForm)
	}
	s, err := parseConnURI(dsn)
	if err != nil {
		return fail("not a URL %s: %v", uriForm, err)
	}
	switch {
	case s["user"] == "":
		return fail("names no user (want %s): the relay would pick one from its environment", uriForm)
	case s["database"] == "":
		return fail("names no database (want %s): the relay would pick one from its environment", uriForm)
	}
	host, hasHost := s["host"]
	if !hasHost {
		return fail("names no host (want %s): the relay would pick one from its environment", uriForm)
	}
	hosts := strings.Split(host, ",")
	ports := strings.Split(s["port"], ",")
	if len(ports) > 1 && len(ports) != len(hosts) {
		return fail("has %d ports for %d hosts", len(ports), len(hosts))
	}
	var files []string
	for _, k := range dsnFileParams {
		if v := s[k]; v != "" && (k != "sslrootcert" || v != "system") {
			files = append(files, k)
		}
	}
	eps := make([]plugins.Endpoint, 0, len(hosts))
	for i, h := range hosts {
		if h == "" {
			// pgx would dial its default: a local socket, or PGHOST.
			return fail("names an empty host (want %s)", uriForm)
		}
		p := ports[0]
		if len(ports) > 1 {
			p = ports[i]
		}
		port := plugins.DefaultPort("postgres")
		if p != "" {
			if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
				return fail("has a port that is not a number from 1 to 65535")
			}
		}
		eps = append(eps, plugins.Endpoint{Path: "dsn", Kind: plugins.EndpointDatabase, Scheme: "postgres",
			Host: h, Port: port, Database: s["database"], User: s["user"], Files: files, Socket: socketHost(h)})
	}
	return eps, nil
}

// socketHost reports whether a libpq host is a unix-domain socket: a
// directory (absolute, as pgx reads one, Windows drives included) or an
// abstract socket name (libpq's "@name").
func socketHost(h string) bool {
	windows := len(h) >= 3 && h[0] >= 'A' && h[0] <= 'Z' && h[1] == ':' && h[2] == '\\'
	return strings.HasPrefix(h, "/") || strings.HasPrefix(h, "@") || windows
}

// parseConnURI splits a postgres:// or postgresql:// URI into settings
// keyed as pgx keys them (user, password, host, port, database and each
// query parameter, "dbname" read as "database"; a query parameter wins
// over the URI's part), following pgx's parseURLSettings (itself libpq's
// conninfo_uri_parse_options): the user info ends at the first '@' before
// any '/'; hosts and ports are comma-separated lists decoded as a whole.
// Nothing is taken from the environment. Its errors quote nothing of the
// URI.
func parseConnURI(uri string) (map[string]string, error) {
	if strings.IndexByte(uri, 0) >= 0 {
		return nil, errors.New("it holds a NUL byte")
	}
	p, ok := strings.CutPrefix(uri, "postgresql://")
	if !ok {
		p, _ = strings.CutPrefix(uri, "postgres://")
	}
	s := map[string]string{}
	p, err := cutUserInfo(p, s)
	if err != nil {
		return nil, err
	}
	hosts, ports, p, err := cutHostList(p)
	if err != nil {
		return nil, err
	}
	if hosts != "" {
		v, err := uriDecode(hosts)
		if err != nil {
			return nil, errors.New("its host is not well encoded")
		}
		s["host"] = v
	}
	if ports != "" {
		v, err := uriDecode(ports)
		if err != nil {
			return nil, errors.New("its port is not well encoded")
		}
		s["port"] = v
	}
	if strings.HasPrefix(p, "/") {
		db := p[1:]
		p = ""
		if i := strings.IndexByte(db, '?'); i >= 0 {
			db, p = db[:i], db[i:]
		}
		if db != "" {
			v, err := uriDecode(db)
			if err != nil {
				return nil, errors.New("its database is not well encoded")
			}
			s["database"] = v
		}
	}
	if rest, ok := strings.CutPrefix(p, "?"); ok {
		if err := parseURIQuery(rest, s); err != nil {
			return nil, err
		}
	} else if p != "" {
		return nil, errors.New("it has text after its hosts that is neither a /database nor a ?query")
	}
	return s, nil
}

// cutUserInfo takes the user info off the front of p, into s: it ends at
// the first '@' before any '/'. Of the password, only its presence is
// noted.
func cutUserInfo(p string, s map[string]string) (string, error) {
	i := strings.IndexAny(p, "@/")
	if i < 0 || p[i] != '@' {
		return p, nil
	}
	user, password, hasPassword := strings.Cut(p[:i], ":")
	if user != "" {
		v, err := uriDecode(user)
		if err != nil {
			return "", errors.New("its user is not well encoded")
		}
		s["user"] = v
	}
	if hasPassword && password != "" {
		s["password"] = "set" // never read: only its presence matters here
	}
	return p[i+1:], nil
}

// cutHostList takes the comma-separated host[:port] list off the front of
// p (an IPv6 host in brackets) and returns its hosts and its ports as
// comma-separated lists, still encoded: libpq decodes each list as a
// whole.
func cutHostList(p string) (hosts, ports, rest string, err error) {
	var hb, pb strings.Builder
	for {
		if strings.HasPrefix(p, "[") {
			end := strings.IndexByte(p, ']')
			if end <= 1 {
				return "", "", "", errors.New("it has a malformed IPv6 host")
			}
			hb.WriteString(p[1:end])
			p = p[end+1:]
			if p != "" && !strings.ContainsAny(p[:1], ":/?,") {
				return "", "", "", errors.New("it has a malformed IPv6 host")
			}
		} else {
			i := strings.IndexAny(p, ":/?,")
			if i < 0 {
				i = len(p)
			}
			hb.WriteString(p[:i])
			p = p[i:]
		}
		if strings.HasPrefix(p, ":") {
			p = p[1:]
			i := strings.IndexAny(p, "/?,")
			if i < 0 {
				i = len(p)
			}
			pb.WriteString(p[:i])
			p = p[i:]
		}
		if !strings.HasPrefix(p, ",") {
			return hb.String(), pb.String(), p, nil
		}
		p = p[1:]
		hb.WriteByte(',')
		pb.WriteByte(',')
	}
}

// parseURIQuery reads a URI's query parameters (after the '?') into s,
// "dbname" as "database"; they win over the URI's parts.
func parseURIQuery(query string, s map[string]string) error {
	for rest := query; rest != ""; {
		var pair string
		pair, rest, _ = strings.Cut(rest, "&")
		rawKey, rawValue, found := strings.Cut(pair, "=")
		if !found || strings.Contains(rawValue, "=") {
			return errors.New("it has a query parameter that is not key=value")
		}
		key, err := uriDecode(rawKey)
		if err != nil {
			return errors.New("it has a query parameter that is not well encoded")
		}
		if key == "dbname" {
			key = "database"
		}
		value, err := uriDecode(rawValue)
		if err != nil {
			return errors.New("it has a query parameter that is not well encoded")
		}
		s[key] = value
	}
	return nil
}

// uriDecode percent-decodes one URI component as libpq does: leading and
// trailing spaces skipped, inner spaces and %00 refused.
func uriDecode(raw string) (string, error) {
	raw = strings.Trim(raw, " ")
	if strings.Contains(raw, " ") {
		return "", errors.New("space")
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] != '%' {
			b.WriteByte(raw[i])
			continue
		}
		if i+2 >= len(raw) {
			return "", errors.New("short escape")
		}
		n, err := strconv.ParseUint(raw[i+1:i+3], 16, 8)
		if err != nil || n == 0 {
			return "", errors.New("bad escape")
		}
		b.WriteByte(byte(n))
		i += 2
	}
	return b.String(), nil
}
