package engine

import (
	"net/url"
	"strings"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// outboxOf is the outbox table spec's source reads, from its config
// (plugins.OutboxSource); nil when it reads none. The canary writes there.
func outboxOf(spec *pipelines.Spec) *plugins.OutboxTable {
	o, ok := spec.Source.Config.(plugins.OutboxSource)
	if !ok {
		return nil
	}
	t := o.OutboxTable()
	return &t
}

// originOf is what components learn of the table t (plugins.Env.Origin):
// its name and its database's, never the DSN.
func originOf(t plugins.OutboxTable) plugins.Origin {
	return plugins.Origin{Database: databaseName(t.DSN), Table: t.Table}
}

// databaseName finds the database name in a PostgreSQL URL or keyword/value
// DSN, without resolving anything (no environment, no service file); ""
// when the DSN does not name one.
func databaseName(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return ""
		}
		if db := u.Query().Get("dbname"); db != "" {
			return db
		}
		return strings.TrimPrefix(u.Path, "/")
	}
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, "dbname="); ok {
			return strings.Trim(v, `'`)
		}
	}
	return ""
}
