package store

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/pgddl"
)

// InstanceStatus is a pipeline's state on the instance that runs it, as
// that instance last reported it: any instance's API can say who runs a
// pipeline and how it is doing, not only the owner's.
type InstanceStatus struct {
	Pipeline   string    `json:"-"`
	Instance   string    `json:"instance"`
	State      string    `json:"state"`
	LastError  string    `json:"last_error,omitempty"`
	Starts     int       `json:"starts"`
	Since      time.Time `json:"since"`
	ReportedAt time.Time `json:"reported_at"`
	// Status is the pipeline's full status as its instance published it
	// (engine.Status as JSON); nil when the instance reported only the
	// columns above.
	Status json.RawMessage `json:"-"`
	// Age is how old the report was by the database's clock when it was
	// read: a reader judges staleness without trusting its own clock.
	Age time.Duration `json:"-"`
}

// statusTableSQL is ferry_pipeline_status as the store's migrations leave
// it (steps 2 and 4), for a coordination database that is not a store.
const statusTableSQL = `CREATE TABLE IF NOT EXISTS ferry_pipeline_status (
    pipeline     text NOT NULL,
    instance     text NOT NULL,
    state        text NOT NULL,
    last_error   text NOT NULL DEFAULT '',
    starts       int NOT NULL DEFAULT 0,
    since        timestamptz NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now(),
    status       jsonb NULL,
    PRIMARY KEY (pipeline, instance)
)`

// StatusTable is ferry_pipeline_status, where instances publish the
// statuses of the pipelines they run, on whichever database holds it: the
// store (created by its migrations), or — with high availability and no
// store — the coordination database, beside the heartbeat table (created
// on first use). It is safe for concurrent use.
type StatusTable struct {
	pool    *pgxpool.Pool
	create  bool // create the table on first use (not a store)
	created atomic.Bool
}

// NewStatusTable is the table on pool's database, a store or not: it is
// created on first use where it is missing. It does no I/O.
func NewStatusTable(pool *pgxpool.Pool) *StatusTable { return &StatusTable{pool: pool, create: true} }

// StatusTable is the store's ferry_pipeline_status.
func (s *Store) StatusTable() *StatusTable { return &StatusTable{pool: s.pool} }

func (t *StatusTable) ensure(ctx context.Context) error {
	if !t.create || t.created.Load() {
		return nil
	}
	// A store's table exists already, and its role may not create tables.
	var exists bool
	if err := t.pool.QueryRow(ctx, `SELECT to_regclass('ferry_pipeline_status') IS NOT NULL`).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if err := pgddl.CreateIfMissing(ctx, t.pool, statusTableSQL); err != nil {
			return fmt.Errorf("create ferry_pipeline_status: %w", err)
		}
	}
	t.created.Store(true)
	return nil
}

// forgetAfter is how long a report no instance refreshes is kept: long
// enough to say "not reporting since", short enough that instances gone
// for good (ids change with every start) do not pile up.
const forgetAfter = time.Hour

// Publish replaces what instance published before with sts — the
// pipelines it runs — in one statement: its other rows go, and so does
// any instance's report older than an hour.
func (t *StatusTable) Publish(ctx context.Context, instance string, sts []InstanceStatus) error {
	if err := t.ensure(ctx); err != nil {
		return err
	}
	type row struct {
		Pipeline  string          `json:"pipeline"`
		State     string          `json:"state"`
		LastError string          `json:"last_error"`
		Starts    int             `json:"starts"`
		Since     time.Time       `json:"since"`
		Status    json.RawMessage `json:"status"`
	}
	rows := make([]row, len(sts))
	for i, st := range sts {
		rows[i] = row{st.Pipeline, st.State, st.LastError, st.Starts, st.Since, st.Status}
	}
	body, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	_, err = t.pool.Exec(ctx, `WITH mine AS (
			SELECT * FROM jsonb_to_recordset($2::jsonb)
				AS r(pipeline text, state text, last_error text, starts int, since timestamptz, status jsonb)),
		gone AS (DELETE FROM ferry_pipeline_status s
			WHERE (s.instance = $1 AND NOT EXISTS (SELECT 1 FROM mine m WHERE m.pipeline = s.pipeline))
			   OR s.reported_at < now() - make_interval(secs => $3))
		INSERT INTO ferry_pipeline_status AS s (pipeline, instance, state, last_error, starts, since, status, reported_at)
		SELECT pipeline, $1, state, coalesce(last_error, ''), coalesce(starts, 0), since, status, now() FROM mine
		ON CONFLICT (pipeline, instance) DO UPDATE SET state = excluded.state, last_error = excluded.last_error,
			starts = excluded.starts, since = excluded.since, status = excluded.status, reported_at = now()`,
		instance, string(body), forgetAfter.Seconds())
	return err
}

// Read returns every report younger than within, freshest first, each
// with its Age by the database's clock.
func (t *StatusTable) Read(ctx context.Context, within time.Duration) ([]InstanceStatus, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	rows, err := t.pool.Query(ctx, `SELECT pipeline, instance, state, last_error, starts, since, reported_at,
			status, extract(epoch FROM now() - reported_at)::float8
		FROM ferry_pipeline_status WHERE reported_at >= now() - make_interval(secs => $1)
		ORDER BY pipeline, reported_at DESC`, within.Seconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceStatus, error) {
		var st InstanceStatus
		var age float64
		err := r.Scan(&st.Pipeline, &st.Instance, &st.State, &st.LastError, &st.Starts, &st.Since, &st.ReportedAt, &st.Status, &age)
		st.Age = time.Duration(age * float64(time.Second))
		return st, err
	})
}

// ReportStatuses replaces what instance reported before with sts (the
// pipelines it runs, not those it holds in standby).
func (s *Store) ReportStatuses(ctx context.Context, instance string, sts []InstanceStatus) error {
	return s.StatusTable().Publish(ctx, instance, sts)
}

// Statuses returns what instances reported within the last fresh, by
// pipeline: a dead instance's reports age out.
func (s *Store) Statuses(ctx context.Context, fresh time.Duration) (map[string][]InstanceStatus, error) {
	list, err := s.StatusTable().Read(ctx, fresh)
	if err != nil {
		return nil, err
	}
	out := map[string][]InstanceStatus{}
	for _, st := range list {
		out[st.Pipeline] = append(out[st.Pipeline], st)
	}
	return out, nil
}
