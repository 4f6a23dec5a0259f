package pgsource

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Horizon is the oldest transaction holding an xid on the server: every
// xid8 cursor on the cluster waits for it.
type Horizon struct {
	Age         time.Duration
	PID         int
	Database    string
	User        string
	Application string
	State       string
	XactStart   time.Time
	Query       string
}

// OldestTransaction finds the oldest running transaction that has an xid,
// in any database of the server (transaction ids are server-wide). ok is
// false when there is none besides this session.
func OldestTransaction(ctx context.Context, q QueryRower) (h Horizon, ok bool, err error) {
	var age float64
	err = q.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM clock_timestamp() - xact_start)::float8, pid,
		COALESCE(datname, ''), COALESCE(usename, ''), COALESCE(application_name, ''), COALESCE(state, ''),
		xact_start, left(COALESCE(query, ''), 200)
		FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
		ORDER BY xact_start LIMIT 1`).Scan(&age, &h.PID, &h.Database, &h.User, &h.Application, &h.State, &h.XactStart, &h.Query)
	found := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Horizon{}, false, err
	}
	h.Age = time.Duration(age * float64(time.Second))
	// A forgotten prepared transaction holds the horizon too, with no session.
	var p Horizon
	var page float64
	err = q.QueryRow(ctx, `SELECT EXTRACT(EPOCH FROM clock_timestamp() - prepared)::float8, database, owner, gid, prepared
		FROM pg_prepared_xacts ORDER BY prepared LIMIT 1`).Scan(&page, &p.Database, &p.User, &p.Query, &p.XactStart)
	if err == nil && (!found || p.XactStart.Before(h.XactStart)) {
		p.Age, p.State = time.Duration(page*float64(time.Second)), "prepared"
		p.Query = "PREPARE TRANSACTION " + p.Query + " (end it with COMMIT PREPARED or ROLLBACK PREPARED)"
		return p, true, nil
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Horizon{}, false, err
	}
	return h, found, nil
}

// Details renders h for plugins.Health.Details.
func (h Horizon) Details() map[string]any {
	return map[string]any{"pid": h.PID, "database": h.Database, "user": h.User, "application": h.Application,
		"state": h.State, "xact_start": h.XactStart, "query": h.Query, "age_seconds": h.Age.Seconds()}
}

// horizonReading is a database's last OldestTransaction answer.
type horizonReading struct {
	at time.Time
	h  Horizon
	ok bool
}

// OldestTransaction is the server's oldest transaction as measured by any
// pipeline on the database within fresh: the horizon is the same for all of
// them, so a thousand pipelines' health loops ask the server once per
// interval, not a thousand times. One caller measures while the others wait
// for its answer.
func (p *Pool) OldestTransaction(ctx context.Context, fresh time.Duration) (Horizon, bool, error) {
	db := p.db
	db.horizonMu.Lock()
	defer db.horizonMu.Unlock()
	if r := db.horizon; !r.at.IsZero() && time.Since(r.at) < fresh {
		h := r.h
		if r.ok {
			h.Age += time.Since(r.at)
		}
		return h, r.ok, nil
	}
	h, ok, err := OldestTransaction(ctx, p)
	if err != nil {
		return h, ok, err
	}
	db.horizon = horizonReading{at: time.Now(), h: h, ok: ok}
	return h, ok, nil
}

// relationReading is a database's last answer on whether a relation exists.
type relationReading struct {
	at     time.Time
	exists bool
}

// RelationExists reports whether the relation name (as to_regclass reads
// it) exists, as any pipeline on the database found within fresh: the
// pipelines of a schema share its backfill request table, and a thousand
// of them need not each ask the catalog every second whether it was
// created.
func (p *Pool) RelationExists(ctx context.Context, name string, fresh time.Duration) (bool, error) {
	db := p.db
	db.relationsMu.Lock()
	defer db.relationsMu.Unlock()
	if r, ok := db.relations[name]; ok && time.Since(r.at) < fresh {
		return r.exists, nil
	}
	var exists bool
	if err := p.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
		return false, err
	}
	if db.relations == nil {
		db.relations = map[string]relationReading{}
	}
	db.relations[name] = relationReading{at: time.Now(), exists: exists}
	return exists, nil
}
