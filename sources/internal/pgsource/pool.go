package pgsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
)

// Connections caps what a source's pool may open at limits.max_connections
// (limit, 0 for none). The process's LISTEN session per database is shared
// by all pipelines and counted by none.
func Connections(want, limit int) int32 {
	if limit > 0 && limit < want {
		return int32(limit)
	}
	return int32(want)
}

// ConnIdleTime closes a shared pool's connection unused this long: idle
// pipelines need few (their reads every idle_poll_interval), and should not
// hold the extra ones a busy minute opened.
const ConnIdleTime = time.Minute

// DefaultDatabaseConnections is the size of a database's shared pool unless
// ferry run --db-max-connections says otherwise.
const DefaultDatabaseConnections = 10

// PoolConfig parses dsn for a pipeline's own pool (the wal source's), whose
// sessions are named ferry:<pipeline> in pg_stat_activity. The error names
// the key (source.dsn) and never quotes the value.
func PoolConfig(dsn, pipeline string) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("source.dsn: %w", err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "ferry:" + pipeline
	return pc, nil
}

// One pool per database serves every polling pipeline (xid8, poll) of the
// process: a thousand idle pipelines on one database hold at most
// --db-max-connections sessions, not a thousand. Each pipeline sees the
// shared pool through a Pool, its share: at most that many of its
// statements run at once (limits.max_connections, or what its source asks
// for), so one pipeline whose statements block (a lock on its table) holds
// its share and no more; the rest wait for a connection in arrival order
// (pgxpool's acquire queue is first-in, first-out).

// databases holds the shared pools by DatabaseKey.
var databases = struct {
	sync.Mutex
	m map[string]*database
}{m: map[string]*database{}}

// database is one shared pool and the pipelines using it.
type database struct {
	key  string
	pool *pgxpool.Pool
	refs int // open Pools

	horizonMu sync.Mutex // held while one caller refreshes the horizon
	horizon   horizonReading

	relationsMu sync.Mutex // held while one caller asks the catalog
	relations   map[string]relationReading

	checks *checkLoop // the shared checks (see AddCheck); guarded by databases
}

// DatabaseKey is what makes two connection strings one database for the
// shared pools: host, port, database, user and password (different
// credentials stay apart), TLS and the run-time parameters — whatever the
// spelling (URL or key=value, order of keys). application_name is not part
// of it: sessions of the shared pool are named ferry:pool.
func DatabaseKey(cfg *pgx.ConnConfig) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\x00%s\x00%t", cfg.Host, cfg.Port, cfg.Database, cfg.User, cfg.Password, cfg.TLSConfig != nil)
	if cfg.TLSConfig != nil {
		fmt.Fprintf(h, "\x00%s", cfg.TLSConfig.ServerName)
	}
	keys := make([]string, 0, len(cfg.RuntimeParams))
	for k := range cfg.RuntimeParams {
		if k != "application_name" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "\x00%s=%s", k, cfg.RuntimeParams[k])
	}
	for _, f := range cfg.Fallbacks {
		fmt.Fprintf(h, "\x00%s:%d", f.Host, f.Port)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Pool is one pipeline's share of its database's shared pool: Exec, Query,
// QueryRow and Begin each hold one of the share's slots until the
// statement's connection goes back (rows closed, row scanned, transaction
// ended). Safe for concurrent use. Create with OpenPool, release with
// ClosePool.
type Pool struct {
	db       *database
	share    chan struct{}
	pipeline string
	once     sync.Once
}

// OpenPool joins the database's shared pool for a polling source (xid8,
// poll), opening it (sized by env.DatabaseConnections, idle connections
// closed after ConnIdleTime, connecting bounded by queryTimeout) if this is
// the first pipeline on the database. The pipeline's share is conns
// statements at once, capped by limits.max_connections and by one less
// than the pool's size. prepare then runs within queryTimeout; if it fails, the share is
// released and its error returned.
func OpenPool(ctx context.Context, dsn string, env plugins.Env, conns int, queryTimeout time.Duration,
	prepare func(context.Context, *Pool) error) (*Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("source.dsn: %w", err)
	}
	size := env.DatabaseConnections
	if size <= 0 {
		size = DefaultDatabaseConnections
	}
	name := "ferry:pool"
	if env.PoolName != "" {
		name = env.PoolName
	}
	key := name + "/" + DatabaseKey(pc.ConnConfig)
	databases.Lock()
	db := databases.m[key]
	if db == nil {
		pc.ConnConfig.RuntimeParams["application_name"] = name
		pc.MaxConns = int32(size)
		pc.MaxConnIdleTime = ConnIdleTime
		pc.ConnConfig.ConnectTimeout = queryTimeout
		pool, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), pc) // connects lazily
		if err != nil {
			databases.Unlock()
			return nil, err
		}
		db = &database{key: key, pool: pool}
		databases.m[key] = db
	}
	db.refs++
	databases.Unlock()
	// One pipeline never holds the whole pool: the others' statements
	// always have a connection to wait for.
	share := min(Connections(conns, env.MaxConnections), max(db.pool.Config().MaxConns-1, 1))
	p := &Pool{db: db, share: make(chan struct{}, max(share, 1)), pipeline: env.Pipeline}
	prepCtx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if err := prepare(prepCtx, p); err != nil {
		ClosePool(p)
		return nil, err
	}
	return p, nil
}

// ClosePool releases a stopping source's share; the last pipeline on a
// database closes its pool, without waiting: closing a connection that died
// without an error (a partition) waits up to 15s for the server's goodbye,
// which must not hold up a shutdown bounded by its drain timeout. Every
// statement of the pipeline has ended by then; the other pipelines on the
// database keep the pool. Safe to call twice.
func ClosePool(p *Pool) {
	p.once.Do(func() {
		databases.Lock()
		defer databases.Unlock()
		p.db.refs--
		if p.db.refs == 0 {
			if databases.m[p.db.key] == p.db {
				delete(databases.m, p.db.key)
			}
			go p.db.pool.Close()
		}
	})
}

// SharedPools is how many shared pools the process holds and the
// connections they have open (for tests and status).
func SharedPools() (pools int, conns int32) {
	databases.Lock()
	defer databases.Unlock()
	for _, db := range databases.m {
		pools++
		conns += db.pool.Stat().TotalConns()
	}
	return pools, conns
}

// Config is the shared pool's configuration (the LISTEN session connects
// with it).
func (p *Pool) Config() *pgxpool.Config { return p.db.pool.Config() }

// Share is how many of the pipeline's statements may run at once.
func (p *Pool) Share() int { return cap(p.share) }

func (p *Pool) acquire(ctx context.Context) error {
	select {
	case p.share <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Pool) releaser() func() {
	var once sync.Once
	return func() { once.Do(func() { <-p.share }) }
}

// Exec runs sql on a connection of the shared pool.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.acquire(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	defer func() { <-p.share }()
	return p.db.pool.Exec(ctx, sql, args...)
}

// Query runs sql; the share's slot is held until the rows are closed or
// read to the end.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	rows, err := p.db.pool.Query(ctx, sql, args...)
	if err != nil {
		<-p.share
		return nil, err
	}
	return &shareRows{Rows: rows, release: p.releaser()}, nil
}

// QueryRow runs sql; the share's slot is held until Scan.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.acquire(ctx); err != nil {
		return errRow{err}
	}
	return shareRow{row: p.db.pool.QueryRow(ctx, sql, args...), release: p.releaser()}
}

// Begin starts a transaction, named ferry:<pipeline> in pg_stat_activity
// while it lasts (set_config local to it), so that an operator sees whose
// transaction holds locks or the xmin horizon; the share's slot is held
// until it commits or rolls back.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	release := p.releaser()
	tx, err := p.db.pool.Begin(ctx)
	if err != nil {
		release()
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('application_name', $1, true)`, "ferry:"+p.pipeline); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		release()
		return nil, err
	}
	return &shareTx{Tx: tx, release: release}, nil
}

// SendBatch sends b's statements in one round trip, which the server runs
// as one implicit transaction; the share's slot is held until the results
// are closed. The error is ctx's, when it ended before a slot was free.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	return &shareBatch{BatchResults: p.db.pool.SendBatch(ctx, b), release: p.releaser()}, nil
}

type shareBatch struct {
	pgx.BatchResults
	release func()
}

func (b *shareBatch) Close() error {
	defer b.release()
	return b.BatchResults.Close()
}

type shareRows struct {
	pgx.Rows
	release func()
}

func (r *shareRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.release()
	return false
}

func (r *shareRows) Close() {
	r.Rows.Close()
	r.release()
}

type shareRow struct {
	row     pgx.Row
	release func()
}

func (r shareRow) Scan(dest ...any) error {
	defer r.release()
	return r.row.Scan(dest...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type shareTx struct {
	pgx.Tx
	release func()
}

func (t *shareTx) Commit(ctx context.Context) error {
	defer t.release()
	return t.Tx.Commit(ctx)
}

func (t *shareTx) Rollback(ctx context.Context) error {
	defer t.release()
	return t.Tx.Rollback(ctx)
}

// QueryRower is a pool, a connection or a transaction.
type QueryRower interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Querier is a pipeline's Pool, a *pgxpool.Pool (ferry doctor's probe) or a
// transaction.
type Querier interface {
	QueryRower
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// ResolveTable finds the outbox table as the server names it (database,
// schema, name: what stable event ids are made of), through to_regclass so
// that the search_path decides an unqualified name as it does for the
// application. source names the `ferry schema` command that creates it.
func ResolveTable(ctx context.Context, q QueryRower, table, source string) (outbox.Table, error) {
	var t outbox.Table
	err := q.QueryRow(ctx, `SELECT current_database(), n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`,
		outbox.Quote(table)).Scan(&t.Database, &t.Schema, &t.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("outbox table %s does not exist (create it with `ferry schema %s --table %s`)", table, source, table)
	}
	return t, err
}

// DrainTimeout is how long a stopping source lets dispatched messages
// finish: the pipeline's drain timeout, else 10s.
func DrainTimeout(env plugins.Env) time.Duration {
	if env.DrainTimeout > 0 {
		return env.DrainTimeout
	}
	return 10 * time.Second
}

// Signal wakes whoever waits on c (capacity 1) without blocking; wake-ups
// coalesce.
func Signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Retry calls open until it succeeds or ctx ends (then ok is false), logging
// and reporting each failure with what was being done: the pipeline shows
// backing_off with the error until open succeeds.
func Retry[T any](ctx context.Context, log *slog.Logger, rep plugins.Reporter, what string, open func(context.Context) (T, error)) (v T, ok bool) {
	bo := retry.Backoff()
	for {
		v, err := open(ctx)
		if err == nil {
			rep.Recovered()
			return v, true
		}
		if ctx.Err() != nil {
			return v, false
		}
		d := bo.NextBackOff()
		rep.Failing(fmt.Errorf("%s: %w", what, err), d)
		log.Error(what+"; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return v, false
		case <-time.After(d):
		}
	}
}

// WaitIdle waits, after a source closed its window, until the router
// resolved every message it was given — at most another drain timeout, so
// a stop stays bounded; past it, it logs that the pipeline did not go quiet.
func WaitIdle(log *slog.Logger, drain time.Duration, idle func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := idle(ctx); err != nil {
		log.Error("events still in flight after stopping; a restart may re-send them out of order", "err", err)
	}
}
