package ownership

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Session is one connection to a database holding every advisory lock an
// instance owns there. Session advisory locks stack on one connection, so
// an instance running a thousand pipelines on one database needs one lock
// session there, not a thousand; and every statement about those locks
// (take, check, look up holders) is one round trip for all of them.
//
// Losing the connection loses every lock on it at once: Check finds out,
// and each Claim then reports itself lost. The next TryLock connects
// again. A Session is safe for concurrent use; its statements run one at a
// time on the connection.
type Session struct {
	dsn, instance string

	mu     sync.Mutex
	conn   *pgx.Conn
	claims map[int64]*Claim // the locks the current connection holds
}

// Claim is one advisory lock held on a Session.
type Claim struct {
	s    *Session
	key  int64
	lost error // set (under s.mu) once the lock is gone
}

// NewSession describes instance's lock session on dsn; no I/O until a
// statement needs the connection.
func NewSession(dsn, instance string) *Session {
	return &Session{dsn: dsn, instance: instance, claims: map[int64]*Claim{}}
}

// statementTimeout bounds every statement on the session: a half-open TCP
// connection answers nothing and reports no error, and until the session
// is known dead its locks are believed held.
const statementTimeout = 5 * time.Second

// connectConfig is a lock session's connection: named for the instance
// (Holder reports it), and with keepalives that end it within seconds of a
// network partition instead of the kernel's two hours — until it ends, the
// server keeps the locks for an owner that may be gone, and no standby can
// take over.
func connectConfig(dsn, instance string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = ApplicationName(instance)
	cfg.RuntimeParams["tcp_keepalives_idle"] = "5"
	cfg.RuntimeParams["tcp_keepalives_interval"] = "2"
	cfg.RuntimeParams["tcp_keepalives_count"] = "3"
	cfg.RuntimeParams["tcp_user_timeout"] = "10000"
	cfg.DialFunc = (&net.Dialer{KeepAlive: 5 * time.Second, Timeout: 10 * time.Second}).DialContext
	return cfg, nil
}

// use runs f on the connection, connecting first if there is none. Any
// error ends the connection, and with it every lock it held: after a
// failed or interrupted statement the session's state on the server is
// unknown (a batch may have taken some locks), and a fresh connection is
// the only state known for sure. When nothing was held, a failure on a
// connection left over from earlier (the server may have ended it while
// idle) is retried once on a new one: nothing was at stake.
//
// The caller holds s.mu.
func (s *Session) use(ctx context.Context, f func(ctx context.Context, conn *pgx.Conn) error) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err // before any statement: the session stays as it is
		}
		reused := s.conn != nil
		if s.conn == nil {
			cfg, err := connectConfig(s.dsn, s.instance)
			if err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, statementTimeout)
			s.conn, err = pgx.ConnectConfig(cctx, cfg)
			cancel()
			if err != nil {
				s.conn = nil
				return err
			}
		}
		// A statement started runs to its end or its timeout: cancelling it
		// midway would break the connection, and with it the locks of every
		// other pipeline on it (at shutdown, while they still drain).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statementTimeout)
		err := f(sctx, s.conn)
		timedOut := sctx.Err() != nil
		cancel()
		if err == nil {
			return nil
		}
		hadClaims := len(s.claims) > 0
		s.drop(fmt.Errorf("ownership connection lost: %w", err))
		// A connection that did not answer in time is no leftover closed
		// while idle: the server or the network is what fails.
		if !reused || hadClaims || attempt > 0 || timedOut {
			return err
		}
	}
}

// drop closes the connection and marks every claim on it lost with why.
func (s *Session) drop(why error) {
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.conn.Close(ctx)
		cancel()
		s.conn = nil
	}
	for k, c := range s.claims {
		c.lost = why
		delete(s.claims, k)
	}
}

// TryLock takes, without waiting, at most limit of keys (all when limit <
// 1), trying them in order, in one statement. It returns a claim for each
// key it took; a key another session holds is skipped. Keys this session
// holds already are returned as they are, not locked again (a session
// lock taken twice would need two unlocks).
func (s *Session) TryLock(ctx context.Context, keys []int64, limit int) (map[int64]*Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]*Claim{}
	var try []int64
	for _, k := range keys {
		if c, ok := s.claims[k]; ok {
			out[k] = c
		} else {
			try = append(try, k)
		}
	}
	if limit > 0 {
		limit -= len(out)
		if limit <= 0 {
			return out, nil
		}
	}
	if len(try) == 0 {
		return out, nil
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	var took []int64
	// No ORDER BY: the executor pulls unnest's rows in array order and the
	// LIMIT stops it at the limit-th lock taken, so keys after it are not
	// tried (a sort would try them all first).
	err := s.use(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		took = took[:0]
		rows, err := conn.Query(ctx, `SELECT key FROM unnest($1::bigint[]) AS key WHERE pg_try_advisory_lock(key) LIMIT $2`, try, lim)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k int64
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return err
			}
			took = append(took, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	for _, k := range took {
		c := &Claim{s: s, key: k}
		s.claims[k] = c
		out[k] = c
	}
	return out, nil
}

// Check asks the server which locks the session holds, in one statement:
// a claim whose lock is gone, or all of them when the connection does not
// answer within a few seconds, is lost from then on. Without claims it
// does nothing.
func (s *Session) Check(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.claims) == 0 {
		return nil
	}
	var held []int64
	err := s.use(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SELECT coalesce(array_agg((classid::bigint << 32) | objid::bigint), '{}') FROM pg_locks
			WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND pid = pg_backend_pid()`).Scan(&held)
	})
	if err != nil {
		return fmt.Errorf("ownership connection lost: %w", err)
	}
	still := make(map[int64]bool, len(held))
	for _, k := range held {
		still[k] = true
	}
	for k, c := range s.claims {
		if !still[k] {
			c.lost = errors.New("ownership lock no longer held")
			delete(s.claims, k)
		}
	}
	return nil
}

// Holders finds, in one statement, who holds each of keys: the instance
// for a lock session of one, the session's application_name otherwise,
// empty for a session this role cannot see. Keys nobody holds are absent.
func (s *Session) Holders(ctx context.Context, keys []int64) (map[int64]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int64]string{}
	if len(keys) == 0 {
		return out, nil
	}
	err := s.use(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		clear(out)
		rows, err := conn.Query(ctx, `SELECT DISTINCT ON (k) k, a.application_name FROM unnest($1::bigint[]) AS k
			JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = k
			LEFT JOIN pg_stat_activity a ON a.pid = l.pid`, keys)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k int64
			var app *string
			if err := rows.Scan(&k, &app); err != nil {
				rows.Close()
				return err
			}
			out[k] = holderName(app)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// holderName is the instance an application_name names.
func holderName(app *string) string {
	if app == nil {
		return "" // a session this role cannot see
	}
	if in, ok := strings.CutPrefix(*app, "ferry owner "); ok {
		return in
	}
	return *app
}

// Close releases every lock by ending the connection; claims on it are
// lost. The session may be used again afterwards (it reconnects).
func (s *Session) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop(errors.New("ownership session closed"))
}

// Key is the claim's advisory lock key.
func (c *Claim) Key() int64 { return c.key }

// Lost says why the lock is gone, as the session's last Check (or failed
// statement) found; nil while it is held. No I/O: Check the session first.
func (c *Claim) Lost() error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.lost
}

// Release unlocks this claim's key alone on the shared session (the
// session's other locks stay). Safe on a lost claim and twice.
func (c *Claim) Release() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims[c.key] != c {
		return // lost already, or released
	}
	delete(s.claims, c.key)
	c.lost = errors.New("ownership released")
	if s.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	defer cancel()
	if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, c.key); err != nil {
		// Ending the connection releases this lock too (and loses the
		// others, which were gone already if the connection was).
		s.drop(fmt.Errorf("ownership connection lost: %w", err))
	}
}
