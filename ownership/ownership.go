// Package ownership lets several Ferry instances run the same pipelines
// with each pipeline owned by exactly one of them at a time.
//
// Ownership is a PostgreSQL session advisory lock on the pipeline's source
// database, held on the instance's lock session there (Session: one
// connection per database holding all of the instance's locks on it): a
// dead instance's connection closes and its locks go with it, and an
// instance that loses its connection has lost ownership of every pipeline
// locked on it. Instances also heartbeat into a small
// table on a coordination database, so each can compute its fair share
// (pipelines ÷ live instances, rounded up) and hand back the excess: adding
// an instance moves work onto it.
//
// It must not import pipelines (which imports it), a component or a lab
// package: of Ferry it needs only internal/pgddl.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/internal/pgddl"
)

// LockKey is the advisory lock key of a pipeline: stable across instances
// and versions, so every instance contends for the same lock.
func LockKey(pipeline string) int64 {
	h := fnv.New64a()
	h.Write([]byte("ferry/pipeline/" + pipeline))
	return int64(h.Sum64() &^ (1 << 63)) // non-negative: pg_locks shows it as two oids
}

// UnitKey is the advisory lock key of a unit: pipelines that share what
// only one instance may use at a time (plugins.HA.Unit) and are owned
// together. The prefix keeps it apart from every pipeline's LockKey.
func UnitKey(unit string) int64 {
	h := fnv.New64a()
	h.Write([]byte("ferry/unit/" + unit))
	return int64(h.Sum64() &^ (1 << 63))
}

// Lock is an advisory lock held on its own connection, for a one-off
// holder (a purge); an instance's pipelines share a Session per database.
type Lock struct {
	conn *pgx.Conn
	key  int64
}

// ApplicationName is the application_name of an instance's lock sessions:
// it names the instance, so one that finds a lock taken can say by whom
// (Holder).
func ApplicationName(instance string) string {
	const prefix, max = "ferry owner ", 63 // NAMEDATALEN-1: the server truncates
	name := prefix + instance
	if len(name) > max {
		name = name[:max]
	}
	return name
}

// TryLock connects to dsn and takes the lock without waiting, on a session
// named ApplicationName(instance). When another session holds it, l is nil
// and holder names that session's instance (its application_name when it
// is not an instance's; empty if the server does not show it).
func TryLock(ctx context.Context, dsn, instance string, key int64) (l *Lock, holder string, err error) {
	cfg, err := connectConfig(dsn, instance)
	if err != nil {
		return nil, "", err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		conn.Close(context.Background())
		return nil, "", err
	}
	if ok {
		return &Lock{conn: conn, key: key}, "", nil
	}
	defer conn.Close(context.Background())
	holder, _, _ = holderOf(ctx, conn, key)
	return nil, holder, nil
}

// Holder finds who holds key on dsn without taking it: held is false when
// nobody does.
func Holder(ctx context.Context, dsn string, key int64) (holder string, held bool, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", false, err
	}
	defer conn.Close(context.Background())
	return holderOf(ctx, conn, key)
}

func holderOf(ctx context.Context, conn *pgx.Conn, key int64) (holder string, held bool, err error) {
	var app *string
	err = conn.QueryRow(ctx, `SELECT a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = $1 LIMIT 1`, key).Scan(&app)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return holderName(app), true, nil
}

// Held checks the lock's connection is alive: if it is not, the lock is
// gone and another instance may own the pipeline already.
func (l *Lock) Held(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var held bool
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
		AND granted AND ((classid::bigint << 32) | objid::bigint) = $1)`, l.key).Scan(&held)
	if err != nil {
		return fmt.Errorf("ownership connection lost: %w", err)
	}
	if !held {
		return errors.New("ownership lock no longer held")
	}
	return nil
}

// Release unlocks and closes the connection. Safe on a dead connection.
func (l *Lock) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, l.key)
	_ = l.conn.Close(ctx)
}

// Registry is the heartbeat table on the coordination database.
type Registry struct {
	dsn, instance string
	every         time.Duration
	conn          *pgx.Conn
}

// NewRegistry describes instance's membership; no I/O until Beat.
func NewRegistry(dsn, instance string, every time.Duration) *Registry {
	return &Registry{dsn: dsn, instance: instance, every: every}
}

// Beat records that this instance is alive and how many pipelines it owns,
// and returns how many instances are alive (heartbeat within three
// intervals), this one included.
func (r *Registry) Beat(ctx context.Context, owned int) (live int, err error) {
	// Bounded: the coordinator runs rounds one after another, so a heartbeat
	// stuck on a dead connection (a half-open TCP connection answers
	// nothing and reports no error) would stop every later round — and with
	// them the restart of each pipeline that stepped down.
	ctx, cancel := context.WithTimeout(ctx, max(5*time.Second, r.every))
	defer cancel()
	if r.conn == nil || r.conn.IsClosed() {
		if r.conn, err = pgx.Connect(ctx, r.dsn); err != nil {
			return 0, err
		}
		if err := pgddl.CreateIfMissing(ctx, r.conn, `CREATE TABLE IF NOT EXISTS ferry_instances (
			id text PRIMARY KEY, heartbeat_at timestamptz NOT NULL, owned int NOT NULL, started_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			r.conn.Close(ctx)
			r.conn = nil
			return 0, err
		}
	}
	err = r.conn.QueryRow(ctx, `WITH beat AS (
			INSERT INTO ferry_instances (id, heartbeat_at, owned) VALUES ($1, now(), $2)
			ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), owned = $2)
		SELECT count(*) + 1 FROM ferry_instances WHERE id <> $1 AND heartbeat_at > now() - make_interval(secs => $3)`,
		r.instance, owned, 3*r.every.Seconds()).Scan(&live)
	if err != nil {
		r.conn.Close(ctx)
		r.conn = nil
	}
	return live, err
}

// Leave removes this instance from the table, so the others take over its
// share at once rather than after its heartbeat expires.
func (r *Registry) Leave() {
	if r.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = r.conn.Exec(ctx, `DELETE FROM ferry_instances WHERE id = $1`, r.instance)
	_ = r.conn.Close(ctx)
	r.conn = nil
}

// FairShare is how many of n pipelines one of live instances should own.
func FairShare(n, live int) int {
	if live < 1 {
		live = 1
	}
	return (n + live - 1) / live
}
