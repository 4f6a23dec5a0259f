package doctor

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// insufficientPrivilege is SQLSTATE 42501: the role may not do what the
// statement asks, whatever the message wrapping it says.
const insufficientPrivilege = "42501"

// denied is the PostgreSQL error refusing the source's role a privilege,
// found however deep a source wrapped it.
func denied(err error) (*pgconn.PgError, bool) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == insufficientPrivilege {
		return pg, true
	}
	return nil, false
}

// tablePrivileges are what each source's role needs on its outbox table
// to read it (docs/security.md, "Least-privilege grants"); DELETE only
// with retention or on_delivered: delete, so not asked for here.
func tablePrivileges(sourceType string) []string {
	if sourceType == "poll" {
		return []string{"SELECT", "UPDATE"} // claim, mark, count failures
	}
	return []string{"SELECT"}
}

// checkPrivileges names what the source's role was refused: the privileges
// its source needs on the outbox table that the role lacks, and the GRANT
// that gives them. Without an outbox table to name, it says what
// PostgreSQL said.
func checkPrivileges(ctx context.Context, spec *pipelines.Spec, pg *pgconn.PgError, o Options) Check {
	c := Check{Stage: StageSource, Status: Unhealthy}
	src, ok := spec.Source.Config.(plugins.OutboxSource)
	if !ok {
		c.Evidence = []string{"the source's role was refused (SQLSTATE 42501): " + redact.String(pg.Message)}
		c.Action = "grant the source's role what its source needs (docs/security.md, Least-privilege grants)"
		return c
	}
	ot := src.OutboxTable()
	schema, rel, ok := strings.Cut(ot.Table, ".")
	if !ok {
		schema, rel = "public", ot.Table
	}
	table := schema + "." + rel
	role := roleOf(ot.DSN)
	need := tablePrivileges(spec.Source.Type)
	lacks, known := missingPrivileges(ctx, ot.DSN, schema, rel, need, o)
	if known && !lacks.usage && len(lacks.table) == 0 {
		// The table is not what was refused (a replication slot, a
		// function): say what PostgreSQL said.
		c.Evidence = []string{fmt.Sprintf("role %s has %s on %s, yet PostgreSQL refused the %s source (SQLSTATE 42501: %s)",
			role, strings.Join(need, ", "), table, spec.Source.Type, redact.String(pg.Message))}
		c.Action = fmt.Sprintf("grant role %s what the %s source needs besides its table (docs/security.md, Least-privilege grants)", role, spec.Source.Type)
		if spec.Source.Type == "wal" {
			c.Action = fmt.Sprintf("the wal source's role needs REPLICATION: ALTER ROLE %s REPLICATION; (docs/security.md, Least-privilege grants)", role)
		}
		return c
	}
	if !known {
		lacks.table = need // the privileges could not be read: ask for all it needs
	}
	what, grants := lacks.grants(schema, table, role)
	c.Evidence = []string{
		fmt.Sprintf("role %s lacks %s: PostgreSQL refused the %s source (SQLSTATE 42501: %s)",
			role, strings.Join(what, " and "), spec.Source.Type, redact.String(pg.Message)),
		fmt.Sprintf("the %s source needs %s on its outbox table", spec.Source.Type, strings.Join(need, ", ")),
	}
	c.Action = fmt.Sprintf("as the owner (of the table, of its schema): %s (docs/security.md, Least-privilege grants: DELETE too with retention or on_delivered: delete)",
		strings.Join(grants, " "))
	return c
}

// lacking is what the source's role lacks: USAGE on the table's schema,
// privileges on the table.
type lacking struct {
	usage bool
	table []string
}

// grants says what is lacking, and the GRANTs that give it to role.
func (l lacking) grants(schema, table, role string) (what, grants []string) {
	if l.usage {
		what = append(what, "USAGE on schema "+schema)
		grants = append(grants, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", schema, role))
	}
	if len(l.table) > 0 {
		what = append(what, strings.Join(l.table, ", ")+" on "+table)
		grants = append(grants, fmt.Sprintf("GRANT %s ON %s TO %s;", strings.Join(l.table, ", "), table, role))
	}
	return what, grants
}

// roleOf is the role a DSN logs in as, as a GRANT names it.
func roleOf(dsn string) string {
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && cfg.User != "" {
		return quoteRole(cfg.User)
	}
	return "<the pipeline's role>"
}

// missingPrivileges asks the database, as the source's role, which of
// need it lacks on schema.rel, and whether it may use schema; known is
// false when it cannot tell. It finds the table in the catalog, which
// asks for no privilege, so a schema it may not use does not hide it.
func missingPrivileges(ctx context.Context, dsn, schema, rel string, need []string, o Options) (l lacking, known bool) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return l, false
	}
	defer conn.Close(context.Background())
	var usage bool
	var oid uint32
	if err := conn.QueryRow(ctx, `SELECT has_schema_privilege(current_user, n.oid, 'USAGE'), c.oid
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`, schema, rel).Scan(&usage, &oid); err != nil {
		return l, false
	}
	l.usage = !usage
	for _, p := range need {
		var has bool
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege(current_user, $1::oid, $2)`, oid, p).Scan(&has); err != nil {
			return l, false
		}
		if !has {
			l.table = append(l.table, p)
		}
	}
	return l, true
}

var plainRole = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// quoteRole is the role as a GRANT names it: as is when plain, else quoted.
func quoteRole(name string) string {
	if plainRole.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}
