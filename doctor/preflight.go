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
// the broker (reachable, answers, the stream, exchange or topic the sink
// would create or use). It creates and changes nothing: no slot, no
// publication, no stream (plugins.DryStarter). Both stages are checked, so one answer names
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
	d.Checks = []Check{checkSourceLive(ctx, spec, p, o), checkBrokerDry(ctx, spec, p, o)}
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

// checkBrokerDry connects the sink without creating or changing anything
// on the broker (DryStart, not Start) and checks it answers; what a start
// would create is evidence ("would create stream ORDERS …"). A sink that
// cannot connect that way is not started: its Start may create objects.
func checkBrokerDry(ctx context.Context, spec *pipelines.Spec, p *engine.Pipeline, o Options) Check {
	c := Check{Stage: StageBroker}
	ds, ok := p.Sink.(plugins.DryStarter)
	if !ok {
		c.Status = Skipped
		c.Evidence = []string{fmt.Sprintf("the %s sink has no read-only connect check (its start may create what it publishes to): not connected", spec.Sink.Type)}
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	notes, err := ds.DryStart(ctx)
	if err != nil {
		c.Status, c.Evidence = Unhealthy, []string{"cannot start: " + redact.String(err.Error())}
		c.Action = "check the broker is up and reachable with the sink's settings, and what it says of the sink's stream, exchange or topic; nothing was created"
		return c
	}
	c.Status, c.Evidence = OK, []string{"connected"}
	if pg, ok := p.Sink.(plugins.Pinger); ok {
		if err := pg.Ping(ctx); err != nil {
			c.Status, c.Evidence = Unhealthy, []string{"the broker does not answer: " + redact.String(err.Error())}
			c.Action = "check the broker is up and reachable with the sink's settings"
			return c
		}
		c.Evidence = []string{"the broker answers"}
	}
	for _, n := range notes {
		c.Evidence = append(c.Evidence, redact.String(n))
	}
	return c
}
