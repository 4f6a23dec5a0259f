package pgsource

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
)

// checkTables creates n tables of one row each and drops them at the end.
func checkTables(t *testing.T, p *Pool, n int) []string {
	t.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("checks_%d_", time.Now().UnixNano())
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s%d", prefix, i)
		if _, err := p.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id int); INSERT INTO %[1]s VALUES (%d)`, name, i)); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	t.Cleanup(func() {
		for _, name := range names {
			_, _ = p.Exec(context.Background(), `DROP TABLE IF EXISTS `+name)
		}
	})
	return names
}

func openCheckPool(t *testing.T, name string) *Pool {
	t.Helper()
	p, err := OpenPool(context.Background(), testenv.Postgres(t), plugins.Env{Pipeline: name, PoolName: "ferry:" + name}, 3, 10*time.Second,
		func(context.Context, *Pool) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ClosePool(p) })
	return p
}

// Checks armed at scattered moments fall into step: with every pipeline's
// check every 300ms, a few seconds take a batch per interval — not one
// per check — and every check reads its own table.
func TestChecksShareOneBatchPerInterval(t *testing.T) {
	p := openCheckPool(t, "checks-batch")
	const n, every = 50, 300 * time.Millisecond
	tables := checkTables(t, p, n)
	var mu sync.Mutex
	runs := make([]int, n)
	got := make([]int, n)
	var handles []*ScheduledCheck
	for i, table := range tables {
		var v int
		h := p.AddCheck(Check{SQL: `SELECT id FROM ` + table, Args: func() []any { return nil }, Timeout: 10 * time.Second,
			Scan: func(r pgx.Row) error { return r.Scan(&v) },
			Done: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("check %d: %v", i, err)
				}
				runs[i]++
				got[i] = v
			}})
		handles = append(handles, h)
		h.Arm(time.Duration(i)*every/n, every)
	}
	start := p.CheckBatches()
	began := time.Now()
	testenv.Eventually(t, 30*time.Second, "every check run ten times", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range runs {
			if r < 10 {
				return false
			}
		}
		return true
	})
	batches := p.CheckBatches() - start
	intervals := float64(time.Since(began)) / float64(every)
	for _, h := range handles {
		h.Remove()
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range got {
		if got[i] != i {
			t.Errorf("check %d read %d, want its own table's %d", i, got[i], i)
		}
	}
	total := 0
	for _, r := range runs {
		total += r
	}
	// One batch per interval, and a few more while the checks fall into
	// step; per check it would be n per interval.
	if float64(batches) > 2*intervals+5 {
		t.Fatalf("%d batches for %d check runs in %.0f intervals; want about one per interval", batches, total, intervals)
	}
	t.Logf("%d check runs in %d batches over %.0f intervals", total, batches, intervals)
}

// A check whose table is locked fails alone, within the lock timeout: the
// other checks of its batch still report their rows, and the loop goes on
// running them while the lock is held.
func TestLockedTableFailsItsCheckAlone(t *testing.T) {
	p := openCheckPool(t, "checks-lock")
	ctx := context.Background()
	tables := checkTables(t, p, 5)
	const locked = 2
	lock, err := p.db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE `+tables[locked]+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var oks, lockErrs atomic.Int64
	var others atomic.Int64
	for i, table := range tables {
		var v int
		h := p.AddCheck(Check{SQL: `SELECT id FROM ` + table, Args: func() []any { return nil }, Timeout: 20 * time.Second,
			Scan: func(r pgx.Row) error { return r.Scan(&v) },
			Done: func(err error) {
				var pgErr *pgconn.PgError
				switch {
				case i == locked && errors.As(err, &pgErr) && pgErr.Code == "55P03":
					lockErrs.Add(1)
				case i != locked && err == nil && v == i:
					others.Add(1)
				case err == nil && i == locked:
					t.Errorf("the locked table's check read %d while the lock was held", v)
				default:
					t.Errorf("check %d: %v (read %d)", i, err, v)
				}
				oks.Add(1)
			}})
		defer h.Remove()
		h.Arm(0, 200*time.Millisecond)
	}
	began := time.Now()
	testenv.Eventually(t, 60*time.Second, "three lock timeouts of the locked table's check, and the others' rows each time", func() bool {
		return lockErrs.Load() >= 3 && others.Load() >= 3*int64(len(tables)-1)
	})
	// Each round waits out the lock timeout once; a batch held until the
	// query timeout (20s) would not get here.
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("three rounds took %s", took)
	}
	t.Logf("%d lock timeouts, %d other checks answered in %s", lockErrs.Load(), others.Load(), time.Since(began).Round(time.Millisecond))
}

// A slow statement (here pg_sleep past the statement timeout, as a backlog
// count over a huge table would be) fails alone, as the server's error,
// and the other checks of its batch are answered: the batch's own
// deadline never cancels them all.
func TestSlowCheckFailsAlone(t *testing.T) {
	p := openCheckPool(t, "checks-slow")
	tables := checkTables(t, p, 4)
	const slow = 1
	var slowErrs, others atomic.Int64
	for i, table := range tables {
		var v int
		sql := `SELECT id FROM ` + table
		if i == slow {
			sql = `SELECT id FROM ` + table + `, pg_sleep(5)`
		}
		// Timeout 2s: each statement of the batch may take 1s.
		h := p.AddCheck(Check{SQL: sql, Args: func() []any { return nil }, Timeout: 2 * time.Second,
			Scan: func(r pgx.Row) error { return r.Scan(&v) },
			Done: func(err error) {
				var pgErr *pgconn.PgError
				switch {
				case i == slow && errors.As(err, &pgErr) && pgErr.Code == "57014":
					slowErrs.Add(1)
				case i != slow && err == nil && v == i:
					others.Add(1)
				default:
					t.Errorf("check %d: %v (read %d)", i, err, v)
				}
			}})
		defer h.Remove()
		h.Arm(0, 300*time.Millisecond)
	}
	testenv.Eventually(t, 20*time.Second, "two statement timeouts of the slow check, and the others' rows each time", func() bool {
		return slowErrs.Load() >= 2 && others.Load() >= 2*int64(len(tables)-1)
	})
}

// inline's literals read back as the strings they were made of, whatever
// standard_conforming_strings says.
func TestInlineLiterals(t *testing.T) {
	p := openCheckPool(t, "checks-inline")
	ctx := context.Background()
	for _, scs := range []string{"on", "off"} {
		for _, v := range []string{`plain`, `it's`, `back\slash`, `\'; DROP TABLE x; --`, `$1`, `''\\`} {
			sql, err := inline(`SELECT $1::text`, []any{v})
			if err != nil {
				t.Fatal(err)
			}
			var got string
			if err := p.db.pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
				if _, err := c.Exec(ctx, "SET standard_conforming_strings = "+scs); err != nil {
					return err
				}
				defer c.Exec(ctx, "RESET standard_conforming_strings")
				// As the batch sends it: a simple query on the connection.
				res, err := c.Conn().PgConn().Exec(ctx, sql).ReadAll()
				if err != nil {
					return err
				}
				got = string(res[0].Rows[0][0])
				return nil
			}); err != nil {
				t.Fatalf("standard_conforming_strings=%s, %q as %s: %v", scs, v, sql, err)
			}
			if got != v {
				t.Errorf("standard_conforming_strings=%s: %q came back as %q (%s)", scs, v, got, sql)
			}
		}
	}
	if sql, _ := inline(`SELECT '$1', $1, $2`, []any{"a", int64(7)}); sql != `SELECT '$1', E'a', 7` {
		t.Errorf("inline: %s", sql)
	}
}
