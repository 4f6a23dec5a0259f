package pgsource

import (
	"context"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// tap is one pipeline's subscription: how often it was woken, and whether
// it was told notifications come.
type tap struct {
	wakes     atomic.Int32
	listening atomic.Bool
	stop      context.CancelFunc
	done      chan struct{}
}

func subscribe(pool *pgxpool.Pool, channel string) *tap {
	ctx, stop := context.WithCancel(context.Background())
	t := &tap{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		Listen(ctx, pool, channel, slog.Default(), func(string) { t.wakes.Add(1) }, t.listening.Store)
	}()
	return t
}

func (t *tap) leave() { t.stop(); <-t.done }

// Pipelines on one database share one LISTEN session: each is woken by its
// own channel only, one that joins later is served by the same session, and
// the session reconnects when lost and ends with the last pipeline.
func TestPipelinesShareOneListenSession(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	// Two pools on one database, as two pipelines have.
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		p, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools[i] = p
	}
	sessions := func() int {
		var n int
		_ = pools[0].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ferry:listen'`).Scan(&n)
		return n
	}
	a, b := subscribe(pools[0], "ch_a"), subscribe(pools[1], "ch_b")
	testenv.Eventually(t, 60*time.Second, "both listening", func() bool { return a.listening.Load() && b.listening.Load() })
	notify := func(ch string) {
		t.Helper()
		if _, err := pools[0].Exec(ctx, `SELECT pg_notify($1, '')`, ch); err != nil {
			t.Fatal(err)
		}
	}
	notify("ch_a")
	testenv.Eventually(t, 60*time.Second, "a woken", func() bool { return a.wakes.Load() == 1 })
	if b.wakes.Load() != 0 {
		t.Fatalf("b woken by a's channel")
	}
	c := subscribe(pools[1], "ch_c") // joins a running session
	testenv.Eventually(t, 60*time.Second, "c listening", c.listening.Load)
	notify("ch_c")
	notify("ch_b")
	testenv.Eventually(t, 60*time.Second, "b and c woken", func() bool { return b.wakes.Load() == 1 && c.wakes.Load() == 1 })
	if n := sessions(); n != 1 {
		t.Fatalf("%d LISTEN sessions for three pipelines on one database, want 1", n)
	}
	// A lost session reconnects and serves everyone again.
	var pid int
	if err := pools[0].QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ferry:listen'`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := pools[0].Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "a new session listening", func() bool {
		var n int
		_ = pools[0].QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'ferry:listen' AND pid <> $1 AND query LIKE 'LISTEN%'`, pid).Scan(&n)
		return n == 1 && a.listening.Load() && sessions() == 1
	})
	notify("ch_a")
	testenv.Eventually(t, 60*time.Second, "a woken after the reconnect", func() bool { return a.wakes.Load() >= 2 })
	a.leave()
	if a.listening.Load() {
		t.Fatal("a still told it listens after leaving")
	}
	notify("ch_b") // the session carries on for the others
	testenv.Eventually(t, 60*time.Second, "b woken again", func() bool { return b.wakes.Load() == 2 })
	b.leave()
	c.leave()
	testenv.Eventually(t, 60*time.Second, "the session closed with the last pipeline", func() bool { return sessions() == 0 })
	listeners.Lock()
	left := len(listeners.m)
	listeners.Unlock()
	if left != 0 {
		t.Fatalf("%d listeners left", left)
	}
}

// A listening session that died without an error (a partition, a NAT that
// forgot it) is noticed by its quiet-time check and replaced.
func TestListenSessionHalfOpen(t *testing.T) {
	defer func(d time.Duration) { listenCheck = d }(listenCheck)
	listenCheck = time.Second
	dsn := testenv.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	a := subscribe(pool, "ch_a")
	defer a.leave()
	testenv.Eventually(t, 60*time.Second, "listening", a.listening.Load)
	proxy.Blackhole()
	proxy.Heal() // the session stays frozen; new connections work
	testenv.Eventually(t, 20*time.Second, "the frozen session given up", func() bool { return !a.listening.Load() })
	testenv.Eventually(t, 20*time.Second, "a new session listening", a.listening.Load)
	direct, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Exec(ctx, `SELECT pg_notify('ch_a', '')`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "woken through the new session", func() bool { return a.wakes.Load() >= 1 })
}
