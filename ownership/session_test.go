package ownership_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/faultproxy"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/ownership"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// locksOf counts the advisory locks each session of instance holds.
func locksOf(t *testing.T, pool *pgxpool.Pool, instance string) (sessions int, locks map[int32]int) {
	t.Helper()
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, ownership.ApplicationName(instance)).Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT l.pid, count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1 GROUP BY l.pid`, ownership.ApplicationName(instance))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	locks = map[int32]int{}
	for rows.Next() {
		var pid int32
		var n int
		if err := rows.Scan(&pid, &n); err != nil {
			t.Fatal(err)
		}
		locks[pid] = n
	}
	return sessions, locks
}

func onlyCount(locks map[int32]int) (pid int32, n int) {
	for p, c := range locks {
		pid, n = p, n+c
	}
	if len(locks) != 1 {
		return 0, -1
	}
	return pid, n
}

// One session takes many locks in one statement, at most the limit;
// another instance takes the rest; holders are found for all keys at once;
// releasing one claim unlocks that key alone; locking a held key again
// does not stack; a terminated session loses every claim, and the next
// TryLock comes back on a new connection.
func TestSessionHoldsManyLocks(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	keys := make([]int64, 100)
	for i := range keys {
		keys[i] = ownership.LockKey("p" + string(rune('A'+i/26)) + string(rune('a'+i%26)))
	}
	a, b := ownership.NewSession(dsn, "a"), ownership.NewSession(dsn, "b")
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)

	ca, err := a.TryLock(ctx, keys, 30)
	if err != nil {
		t.Fatal(err)
	}
	if len(ca) != 30 {
		t.Fatalf("a took %d locks; want the limit, 30", len(ca))
	}
	for _, k := range keys[:30] {
		if ca[k] == nil {
			t.Fatalf("a did not take key %d, one of the first 30 it tried", k)
		}
	}
	cb, err := b.TryLock(ctx, keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(cb) != 70 {
		t.Fatalf("b took %d locks; want the 70 a left", len(cb))
	}
	n, locks := locksOf(t, pool, "a")
	pidA, held := onlyCount(locks)
	if n != 1 || held != 30 {
		t.Fatalf("a: %d sessions, locks per session %v; want one session holding 30", n, locks)
	}
	if n, locks := locksOf(t, pool, "b"); n != 1 || len(locks) != 1 {
		t.Fatalf("b: %d sessions, locks per session %v; want one", n, locks)
	}

	holders, err := b.Holders(ctx, append(keys, ownership.LockKey("nobody")))
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := "b"
		if i < 30 {
			want = "a"
		}
		if holders[k] != want {
			t.Fatalf("holder of key %d: %q; want %q", i, holders[k], want)
		}
	}
	if h, ok := holders[ownership.LockKey("nobody")]; ok {
		t.Fatalf("a key nobody holds has holder %q", h)
	}

	// Locking what it holds does not stack: one release frees the key.
	again, err := a.TryLock(ctx, keys[:1], 0)
	if err != nil || again[keys[0]] != ca[keys[0]] {
		t.Fatalf("relocking a held key: %v, %v; want the same claim", again, err)
	}
	ca[keys[0]].Release()
	ca[keys[0]].Release() // twice is safe
	if _, locks := locksOf(t, pool, "a"); locks[pidA] != 29 {
		t.Fatalf("a holds %v after releasing one of 30; want 29 on the same session", locks)
	}
	if err := a.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if ca[keys[1]].Lost() != nil || ca[keys[0]].Lost() == nil {
		t.Fatalf("after releasing key 0: key 0 lost %v, key 1 lost %v; want only key 0", ca[keys[0]].Lost(), ca[keys[1]].Lost())
	}
	if c, err := b.TryLock(ctx, keys[:1], 0); err != nil || c[keys[0]] == nil {
		t.Fatalf("b could not take the released key: %v", err)
	}

	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pidA); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(ctx); err == nil {
		t.Fatal("Check found the terminated session alive")
	}
	for _, k := range keys[1:30] {
		if ca[k].Lost() == nil {
			t.Fatalf("key %d not lost with its session", k)
		}
	}
	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check without claims: %v", err)
	}
	// The server ends the backend (releasing its locks) a moment after
	// telling the client.
	testenv.Eventually(t, 10*time.Second, "the terminated session gone", func() bool { n, _ := locksOf(t, pool, "a"); return n == 0 })
	// b takes the freed keys, and a's next TryLock connects again.
	cb2, err := b.TryLock(ctx, keys[1:20], 0)
	if err != nil || len(cb2) != 19 {
		t.Fatalf("b took %d of the 19 freed keys (%v)", len(cb2), err)
	}
	ca2, err := a.TryLock(ctx, keys[20:30], 0)
	if err != nil || len(ca2) != 10 {
		t.Fatalf("a took %d of 10 free keys after losing its session (%v)", len(ca2), err)
	}
	n, locks = locksOf(t, pool, "a")
	if pid, held := onlyCount(locks); n != 1 || held != 10 || pid == pidA {
		t.Fatalf("a: %d sessions, locks per session %v (old pid %d); want one new session holding 10", n, locks, pidA)
	}
}

// A lock session whose connection goes half-open (the peer answers
// nothing and no error comes) is found dead by Check within its statement
// timeout, and every claim on it is lost.
func TestSessionHalfOpen(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, u.Host)
	u.Host = p.Addr()
	s := ownership.NewSession(u.String(), "a")
	t.Cleanup(s.Close)
	keys := []int64{ownership.LockKey("x"), ownership.LockKey("y"), ownership.LockKey("z")}
	claims, err := s.TryLock(ctx, keys, 0)
	if err != nil || len(claims) != 3 {
		t.Fatalf("took %d of 3 locks: %v", len(claims), err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	start := time.Now()
	if err := s.Check(ctx); err == nil {
		t.Fatal("Check found a half-open session alive")
	}
	t.Logf("half-open lock session found dead after %s", time.Since(start).Round(time.Millisecond))
	for _, k := range keys {
		if claims[k].Lost() == nil {
			t.Errorf("claim on %d not lost with its half-open session", k)
		}
	}
}
