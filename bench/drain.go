package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/watermillsql"
)

// drainScenario times, per repeat and sink, the drain of a prefilled
// backlog: the ceiling, each chosen watermill-sql baseline, and Ferry on
// each source.
func (r *runner) drainScenario(ctx context.Context) error {
	var errs []error
	for rep := range r.o.Repeat {
		for _, sink := range r.o.Sinks {
			if r.wants(SystemCeiling) {
				m, err := r.ceiling(ctx, ScenarioDrain, SystemCeiling, sink, rep)
				errs = append(errs, r.record(ScenarioDrain, SystemCeiling, "", sink, m, err))
			}
			if r.wants(SystemFranzCeiling) && sink == kafka.Name {
				m, err := r.ceiling(ctx, ScenarioDrain, SystemFranzCeiling, sink, rep)
				errs = append(errs, r.record(ScenarioDrain, SystemFranzCeiling, "", sink, m, err))
			}
			if r.wants(SystemWatermill) {
				for _, b := range Baselines {
					if !slices.Contains(r.o.Baselines, b) {
						continue
					}
					m, err := r.watermillDrain(ctx, sink, rep, SystemWatermill, b)
					errs = append(errs, r.record(ScenarioDrain, SystemWatermill, baselineSource(b, sink), sink, m, err))
					// The comparison Watermill users ask for: its forwarder
					// (watermill-sql subscriber → forwarder → broker), and Ferry's
					// watermill_sql source on the same kind of table.
					if b == BaselineForwarder && r.wants(SystemFerry) {
						m, err := r.watermillDrain(ctx, sink, rep, SystemFerry, b)
						errs = append(errs, r.record(ScenarioDrain, SystemFerry, watermillsql.Name, sink, m, err))
					}
				}
			}
			for _, src := range r.sources() {
				m, err := r.ferryDrain(ctx, ScenarioDrain, src, sink, r.o.Events, r.o.Verify, rep)
				errs = append(errs, r.record(ScenarioDrain, SystemFerry, src, sink, m, err))
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	return errors.Join(errs...)
}

// ferryDrain prefills n rows and drains them through a Ferry pipeline.
func (r *runner) ferryDrain(ctx context.Context, scenario, source, sink string, n int, verifyIDs bool, rep int) (Measurement, error) {
	id := r.nextID(scenario, source, sink)
	label := fmt.Sprintf("%s ferry %s", scenario, arrow(source, sink))
	table := "bench_" + id
	pool := r.s.pool
	if err := createOutbox(ctx, pool, source, table); err != nil {
		return Measurement{}, err
	}
	defer dropTable(pool, table)
	if source == wal.Name {
		if err := prepareSlot(ctx, pool, id, table); err != nil {
			return Measurement{}, err
		}
		defer dropSlot(context.Background(), pool, id)
	}
	if err := prefill(ctx, pool, table, n, r.prog.counter(label+": prefill", n)); err != nil {
		return Measurement{}, err
	}
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	j := job{System: SystemFerry, Mode: modeDrain, Expect: n, Pipelines: r.pipelineYAML(id, source, table, t)}
	m, err := r.drainChild(ctx, id, label, j, n)
	if err != nil {
		return m, err
	}
	m.Scenario, m.System, m.Source, m.Sink, m.Repeat = scenario, SystemFerry, source, sink, rep
	if err := r.verify(ctx, label, &m, t, n, verifyIDs); err != nil {
		return m, err
	}
	return m, nil
}

// Baselines are the watermill-sql builds drain measures (Options.Baselines),
// in report order.
const (
	// BaselineRouter is what a Watermill user builds: the watermill-sql
	// subscriber (batch 100, its default) in a router whose handler forwards
	// to Watermill's publisher for the broker. Ferry's "× watermill-sql" is
	// its ratio to this one.
	BaselineRouter = "router"
	// BaselineBatch1000 is the same with the subscriber reading 1,000 rows
	// at a time.
	BaselineBatch1000 = "router-1000"
	// BaselineForwarder is Watermill's components/forwarder (envelopes in
	// watermill-sql's table → Watermill's publisher); with system ferry it is
	// measured against Ferry's watermill_sql source on the same envelopes.
	BaselineForwarder = "forwarder"
	// BaselineFerrySink is the router build publishing through the Ferry
	// sink instead of Watermill's publisher: the subscriber's cost apart.
	BaselineFerrySink = "ferry-sink"
)

var (
	Baselines        = []string{BaselineRouter, BaselineBatch1000, BaselineForwarder, BaselineFerrySink}
	DefaultBaselines = []string{BaselineRouter, BaselineBatch1000, BaselineForwarder}
)

// watermillPublisherName is the Watermill module that publishes to sink.
func watermillPublisherName(sink string) string {
	switch sink {
	case nats.Name:
		return "watermill-nats"
	case kafka.Name:
		return "watermill-kafka"
	case rabbitmq.Name:
		return "watermill-amqp"
	}
	return "watermill-" + sink
}

// baselineSource labels baseline b into sink in the report's source column.
func baselineSource(b, sink string) string {
	switch b {
	case BaselineBatch1000:
		return "batch 1000 → " + watermillPublisherName(sink)
	case BaselineForwarder:
		return "forwarder → " + watermillPublisherName(sink)
	case BaselineFerrySink:
		return "batch 100 → Ferry sink"
	}
	return "batch 100 → " + watermillPublisherName(sink)
}

// watermillDrain prefills n rows into watermill-sql's table and drains them
// through baseline b (system watermill-sql), or — b being the forwarder —
// through Ferry's watermill_sql source with forwarder: true (system ferry).
func (r *runner) watermillDrain(ctx context.Context, sink string, rep int, system, b string) (Measurement, error) {
	n := r.o.Events
	ferry := system == SystemFerry
	fwd := b == BaselineForwarder
	kind := map[string]string{BaselineRouter: "wm", BaselineBatch1000: "wmk", BaselineForwarder: "wmf", BaselineFerrySink: "wms"}[b]
	label := "drain watermill-sql " + arrow(baselineSource(b, sink), sink)
	if ferry {
		kind, label = "fwm", fmt.Sprintf("drain ferry watermill_sql (forwarder envelopes) →%s", sink)
	}
	id := r.nextID(ScenarioDrain, kind, sink)
	topic := "bench_" + id
	pool := r.s.pool
	table, err := watermillTable(ctx, pool, topic)
	if err != nil {
		return Measurement{}, err
	}
	defer func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table)
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS "watermill_offsets_`+topic+`"`)
	}()
	t, err := r.s.target(ctx, sink, id)
	if err != nil {
		return Measurement{}, err
	}
	defer t.cleanup()
	if fwd {
		err = prefillForwarder(ctx, pool, topic, destination(t), n, r.prog.counter(label+": prefill", n))
	} else {
		err = prefillWatermill(ctx, pool, topic, n, r.prog.counter(label+": prefill", n))
	}
	if err != nil {
		return Measurement{}, err
	}
	j := job{System: SystemWatermill, Mode: modeDrain, Expect: n, Sink: sink, SinkYAML: sinkYAML(t, r.set[sink]), DSN: r.s.dsn,
		Topic: topic, Forwarder: fwd, Destination: destination(t), Publisher: publisherWatermill, Batch: watermillBatch}
	switch b {
	case BaselineBatch1000:
		j.Batch = 1000
	case BaselineFerrySink:
		j.Publisher = publisherFerry
	}
	if ferry {
		j = job{System: SystemFerry, Mode: modeDrain, Expect: n, Pipelines: r.watermillPipelineYAML(id, topic, fwd, t)}
	}
	m, err := r.drainChild(ctx, id, label, j, n)
	if err != nil {
		return m, err
	}
	m.Scenario, m.System, m.Sink, m.Repeat = ScenarioDrain, SystemWatermill, sink, rep
	m.Source, m.Baseline = baselineSource(b, sink), b
	if ferry {
		m.System, m.Source, m.Baseline = SystemFerry, watermillsql.Name, ""
	}
	return m, r.verify(ctx, label, &m, t, n, r.o.Verify)
}
