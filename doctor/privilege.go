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
	table := ot.Table
	if !strings.Contains(table, ".") {
		table = "public." + table
	}
	role := "<the pipeline's role>"
	if cfg, err := pgconn.ParseConfig(ot.DSN); err == nil && cfg.User != "" {
		role = quoteRole(cfg.User)
	}
	need := tablePrivileges(spec.Source.Type)
	missing := missingPrivileges(ctx, ot.DSN, ot.Table, need, o)
	if len(missing) == 0 {
		missing = need // the privileges could not be read: ask for all it needs
	}
	c.Evidence = []string{
		fmt.Sprintf("role %s lacks %s on %s: PostgreSQL refused the %s source (SQLSTATE 42501: %s)",
			role, strings.Join(missing, ", "), table, spec.Source.Type, redact.String(pg.Message)),
		fmt.Sprintf("the %s source needs %s on its outbox table", spec.Source.Type, strings.Join(need, ", ")),
	}
	c.Action = fmt.Sprintf("as the table's owner: GRANT %s ON %s TO %s; (docs/security.md, Least-privilege grants: DELETE too with retention or on_delivered: delete)",
		strings.Join(missing, ", "), table, role)
	return c
}

// missingPrivileges asks the database, as the source's role, which of
// need it lacks on table; nil when it cannot tell.
func missingPrivileges(ctx context.Context, dsn, table string, need []string, o Options) []string {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil
	}
	defer conn.Close(context.Background())
	var missing []string
	for _, p := range need {
		var has bool
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege(current_user, $1::regclass, $2)`, table, p).Scan(&has); err != nil {
			return nil
		}
		if !has {
			missing = append(missing, p)
		}
	}
	return missing
}

var plainRole = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// quoteRole is the role as a GRANT names it: as is when plain, else quoted.
func quoteRole(name string) string {
	if plainRole.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}
