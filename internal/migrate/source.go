package migrate

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// connection maps the connector's database options onto the wal source's
// DSN:
//
//	database.hostname, database.port, database.dbname  the DSN's host, port, path
//	database.user                                     its user
//	database.password                                 ${opts.PasswordVar}, never copied
//	database.sslmode, .sslcert, .sslkey, .sslrootcert its query string
func (t *translation) connection(opts Options) (dsn string, hasPassword bool, err error) {
	host, port, db, user := t.take("database.hostname"), t.take("database.port"), t.take("database.dbname"), t.take("database.user")
	password := t.take("database.password")
	if host == "" || db == "" {
		return "", false, errors.New("database.hostname and database.dbname are required to build the source DSN")
	}
	u := url.URL{Scheme: "postgres", Host: host, Path: "/" + db}
	if port != "" && port != "5432" {
		u.Host = host + ":" + port
	}
	q := url.Values{}
	if m := t.take("database.sslmode"); m != "" {
		q.Set("sslmode", m)
	}
	for _, k := range []string{"database.sslcert", "database.sslkey", "database.sslrootcert"} {
		if v := t.take(k); v != "" {
			q.Set(strings.TrimPrefix(k, "database."), v)
		}
	}
	u.RawQuery = q.Encode()
	dsn = u.String()
	if user != "" {
		cred := url.PathEscape(user)
		if password != "" {
			// Never copy the password: it comes from the environment.
			cred += ":${" + opts.PasswordVar + "}"
		}
		dsn = strings.Replace(dsn, "postgres://", "postgres://"+cred+"@", 1)
	}
	return dsn, password != "", nil
}

// outboxTable maps the table list onto source.table:
//
//	table.include.list (table.whitelist)  its first table; others noted
func (t *translation) outboxTable() (string, error) {
	tables := splitList(t.take("table.include.list", "table.whitelist"))
	table := "outbox"
	switch len(tables) {
	case 0:
		t.comment("table.include.list is not set: source.table assumes public.outbox")
	case 1:
		table = tables[0]
	default:
		table = tables[0]
		t.notes = append(t.notes, Note{Key: "table.include.list", Value: strings.Join(tables, ","),
			Why: "a Ferry pipeline reads one outbox table; this one reads " + table + ", add a pipeline per other table"})
	}
	if strings.ContainsAny(table, `\*+?[](){}|^$`) {
		return "", fmt.Errorf("table.include.list %q is a regular expression: name the outbox table (schema.table)", table)
	}
	return table, nil
}

// replication maps the slot options onto the wal source's lines:
//
//	plugin.name                 must be pgoutput to reuse the slot
//	slot.name, publication.name source.slot, source.publication (with opts.ReuseSlot)
//	snapshot.mode               source.initial_snapshot (on a new slot)
//	slot.drop.on.stop           source.drop_slot_on_stop
//	heartbeat.interval.ms       source.heartbeat_interval
//	status.update.interval.ms   source.status_interval
func (t *translation) replication(opts Options) ([]string, error) {
	var src []string
	plugin := t.take("plugin.name")
	if plugin == "" {
		plugin = "decoderbufs" // Debezium's default before 2.0; 2.x defaults to pgoutput
		if _, ok := t.cfg["topic.prefix"]; ok {
			plugin = "pgoutput"
		}
	}
	slot, pub := t.take("slot.name"), t.take("publication.name")
	if slot == "" {
		slot = "debezium"
	}
	if pub == "" {
		pub = "dbz_publication"
	}
	if opts.ReuseSlot {
		if plugin != "pgoutput" {
			return nil, fmt.Errorf("--reuse-slot: the connector's slot %s uses the %s plugin; Ferry reads pgoutput slots only: start on a new slot instead (see Coming from Debezium in the README)", slot, plugin)
		}
		src = append(src, "slot: "+slot, "publication: "+pub,
			"initial_snapshot: false   # resume where Debezium's slot was confirmed")
	} else {
		t.comment(fmt.Sprintf("a new slot and publication (Ferry's defaults); Debezium's slot %s stays until you drop it: SELECT pg_drop_replication_slot('%s');", slot, slot))
		src = append(src, t.initialSnapshot())
	}
	if t.take("slot.drop.on.stop") == "true" {
		src = append(src, "drop_slot_on_stop: true")
	}
	if v := t.take("heartbeat.interval.ms"); v != "" {
		if d, ok := millis(v); ok {
			src = append(src, "heartbeat_interval: "+d)
		}
	}
	if v := t.take("status.update.interval.ms"); v != "" {
		if d, ok := millis(v); ok {
			src = append(src, "status_interval: "+d)
		}
	}
	return src, nil
}

// initialSnapshot maps snapshot.mode onto a new slot's initial_snapshot.
func (t *translation) initialSnapshot() string {
	switch mode := t.take("snapshot.mode"); mode {
	case "", "initial", "when_needed":
		return "initial_snapshot: true    # delivers the rows already in the table, then streams"
	case "never", "no_data", "schema_only":
		return "initial_snapshot: false   # snapshot.mode=" + mode
	default:
		t.notes = append(t.notes, Note{Key: "snapshot.mode", Value: mode, Why: "Ferry snapshots once, when the slot is created (initial_snapshot)"})
		return "initial_snapshot: true"
	}
}

// millis renders a millisecond option as a Go duration.
func millis(v string) (string, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return "", false
	}
	return (time.Duration(n) * time.Millisecond).String(), true
}
