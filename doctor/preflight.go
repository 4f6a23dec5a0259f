package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// Preflight checks what a start of the pipeline would need before it is
// created or changed (`ferry validate --connect`, the API's
// ?connect=true): the source database (reachable, the table and its
// columns, the role's privileges on it, what a replication slot needs) and
// the broker (reachable, answers). It creates nothing: no slot, no
// publication, no stream. Both stages are checked, so one answer names
// everything that would fail; Healthy is false when either is unhealthy.
func Preflight(ctx context.Context, spec *pipelines.Spec, o Options) Diagnosis {
	o.defaults()
	d := Diagnosis{Pipeline: spec.Name, Tenant: spec.Tenant}
	p, err := engine.Build(spec, plugins.Env{PoolName: "ferry:doctor", Logger: o.Logger})
	if err != nil {
		d.Checks = []Check{{Stage: StageSource, Status: Unhealthy, Evidence: []string{redact.String(err.Error())}}}
		d.Stage = StageSource
		return d
	}
	defer p.Close()
	d.Checks = []Check{checkSourceLive(ctx, spec, p, o), checkBroker(ctx, p, o)}
	for _, c := range d.Checks {
		if c.Status == Unhealthy && d.Stage == "" {
			d.Stage = c.Stage
		}
	}
	d.Healthy = d.Stage == ""
	return d
}

// checkSourceLive runs the source's own start-up checks; a refusal
// (SQLSTATE 42501) is named with the grant that cures it, and a table the
// role can read but may not mark (poll's UPDATE) is found before the first
// delivery fails on it.
func checkSourceLive(ctx context.Context, spec *pipelines.Spec, p *engine.Pipeline, o Options) Check {
	c := Check{Stage: StageSource}
	sc, ok := p.Source.(plugins.SchemaChecker)
	if !ok {
		c.Status, c.Evidence = Skipped, []string{fmt.Sprintf("the %s source has no connect check", spec.Source.Type)}
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := sc.CheckSchema(ctx); err != nil {
		if pg, ok := denied(err); ok {
			return checkPrivileges(ctx, spec, pg, o)
		}
		c.Status = Unhealthy
		for _, e := range plugins.Flatten(err) {
			c.Evidence = append(c.Evidence, redact.String(e.Error()))
		}
		c.Action = "fix the source's settings or the database as each line says; nothing was created"
		return c
	}
	if pc := checkGrants(ctx, spec, o); pc != nil {
		return *pc
	}
	c.Status, c.Evidence = OK, []string{"the source database is reachable and its table is as the source needs"}
	return c
}

// checkGrants finds privileges the source needs on its table beyond the
// SELECT its schema check proved; nil when it has them or cannot tell.
func checkGrants(ctx context.Context, spec *pipelines.Spec, o Options) *Check {
	src, ok := spec.Source.Config.(plugins.OutboxSource)
	if !ok {
		return nil
	}
	ot := src.OutboxTable()
	schema, rel, ok := strings.Cut(ot.Table, ".")
	if !ok {
		schema, rel = "public", ot.Table
	}
	lacks, known := missingPrivileges(ctx, ot.DSN, schema, rel, tablePrivileges(spec.Source.Type), o)
	if !known || (!lacks.usage && len(lacks.table) == 0) {
		return nil
	}
	role := roleOf(ot.DSN)
	what, grants := lacks.grants(schema, schema+"."+rel, role)
	return &Check{Stage: StageSource, Status: Unhealthy,
		Evidence: []string{fmt.Sprintf("role %s lacks %s, which the %s source needs (it would be refused with SQLSTATE 42501 at its first use)",
			role, strings.Join(what, " and "), spec.Source.Type)},
		Action: "as the owner (of the table, of its schema): " + strings.Join(grants, " ")}
}
