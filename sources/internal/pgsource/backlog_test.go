package pgsource

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

// countAbove counts the rows of backlog_events above *from: a source's
// backlog query, its argument a cursor that moves.
func countAbove(from *atomic.Int64) func() BacklogQuery {
	return func() BacklogQuery {
		return BacklogQuery{SQL: `SELECT count(*), 0::float8 FROM backlog_events WHERE n > $1`, Args: []any{from.Load()},
			Scan: func(r pgx.Row) (plugins.Health, error) {
				var n int64
				var age float64
				if err := r.Scan(&n, &age); err != nil {
					return plugins.Health{}, err
				}
				return EventBacklog(n, age, map[string]any{"from": from.Load()}), nil
			}}
	}
}

// Watch measures at once and every interval with the query's current
// arguments, adds the oldest transaction (and, with HolderDetails, its
// session), tells Stored, and keeps the last good measurement when one
// fails; Probe measures once, without the holder unless asked.
func TestBacklog(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	pool, err := OpenPool(ctx, dsn, plugins.Env{Pipeline: "backlog"}, 2, 10*time.Second, func(context.Context, *Pool) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ClosePool(pool) })
	if _, err := pool.Exec(ctx, `CREATE TABLE backlog_events (n int); INSERT INTO backlog_events VALUES (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}
	// A transaction with an xid, held open: the server's horizon.
	holder, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	holderPID := int(holder.PgConn().PID())

	var stored atomic.Int32
	b := &Backlog{Interval: 200 * time.Millisecond, Timeout: 5 * time.Second, HolderDetails: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Stored: func(plugins.Health) { stored.Add(1) }}
	var from atomic.Int64
	watchCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.Watch(watchCtx, pool, countAbove(&from)) }()
	defer func() { stop(); <-done }()

	testenv.Eventually(t, 60*time.Second, "a backlog of 3 with the holder", func() bool {
		h := b.Health()
		tx, _ := h.Details["oldest_transaction"].(map[string]any)
		return h.Backlog == 3 && h.BacklogUnit == "events" && h.XminHorizonAge() > 0 && tx["pid"] == holderPID
	})
	from.Store(1)
	testenv.Eventually(t, 60*time.Second, "the backlog past the moved cursor", func() bool { return b.Health().Backlog == 2 })
	if stored.Load() < 2 {
		t.Errorf("Stored was told %d measurements, want at least 2", stored.Load())
	}

	if _, err := pool.Exec(ctx, `ALTER TABLE backlog_events RENAME TO backlog_gone`); err != nil {
		t.Fatal(err)
	}
	last := b.Health()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if h := b.Health(); h.Backlog != 2 || !h.CheckedAt.Equal(last.CheckedAt) {
			t.Fatalf("a failed measurement replaced the last good one: %+v", h)
		}
		time.Sleep(50 * time.Millisecond)
	}

	probe := &Backlog{Interval: time.Second, Timeout: 5 * time.Second}
	h, err := probe.Probe(ctx, dsn, plugins.Env{Pipeline: "backlog-probe"}, func(ctx context.Context, p *Pool) (BacklogQuery, error) {
		_, err := p.Exec(ctx, `ALTER TABLE IF EXISTS backlog_gone RENAME TO backlog_events`)
		return countAbove(&from)(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, named := h.Details["oldest_transaction"]; h.Backlog != 2 || h.XminHorizonAge() <= 0 || named {
		t.Fatalf("Probe = %+v, want a backlog of 2 with the horizon's age and not its session", h)
	}
	if !probe.Health().CheckedAt.IsZero() {
		t.Errorf("Probe kept its measurement: %+v", probe.Health())
	}
}
