package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
)

func setup(t testing.TB, cfg consumer.Config) (*consumer.Consumer, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ddl, err := consumer.Schema(cfg.Table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, ddl+appSchema); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, pool
}

func event(id, agg, version string, amount int64) *message.Message {
	body, _ := json.Marshal(map[string]int64{"amount": amount})
	m := message.NewMessage(id, body)
	m.Metadata.Set(consumer.AggregateTypeHeader, "account")
	m.Metadata.Set(consumer.AggregateIDHeader, agg)
	if version != "" {
		m.Metadata.Set(consumer.VersionHeader, version)
	}
	return m
}

func state(t testing.TB, pool *pgxpool.Pool, agg string) fold {
	var f fold
	pool.QueryRow(context.Background(), `SELECT hash, n FROM accounts WHERE id = $1`, agg).Scan(&f.hash, &f.n)
	return f
}

// A redelivered event has no second effect; a version at or below the
// applied one (a re-send under another id, a version going backwards) is
// skipped and counted; the next version applies.
func TestInboxAndStaleVersions(t *testing.T) {
	c, pool := setup(t, consumer.Config{})
	ctx := context.Background()
	steps := []struct {
		msg  *message.Message
		want consumer.Outcome
	}{
		{event("e1", "a", "1", 5), consumer.Applied},
		{event("e1", "a", "1", 5), consumer.Duplicate},
		{event("e2", "a", "2", 7), consumer.Applied},
		{event("e2", "a", "2", 7), consumer.Duplicate},
		{event("e1-again", "a", "1", 5), consumer.Stale}, // backwards
		{event("e2-again", "a", "2", 7), consumer.Stale}, // at applied
		{event("e3", "a", "3", 9), consumer.Applied},
	}
	for i, s := range steps {
		got, err := c.Process(ctx, s.msg, apply)
		if err != nil || got != s.want {
			t.Fatalf("step %d (%s v%s): %v, %v; want %v", i, s.msg.UUID, s.msg.Metadata.Get(consumer.VersionHeader), got, err, s.want)
		}
	}
	if want := (fold{}).apply(5).apply(7).apply(9); state(t, pool, "a") != want {
		t.Fatalf("state %+v, want %+v", state(t, pool, "a"), want)
	}
	m := c.Metrics()
	if testutil.ToFloat64(m.Duplicates) != 2 || testutil.ToFloat64(m.Stale) != 2 || testutil.ToFloat64(m.Applied) != 3 {
		t.Fatalf("duplicates %v, stale %v, applied %v", testutil.ToFloat64(m.Duplicates), testutil.ToFloat64(m.Stale), testutil.ToFloat64(m.Applied))
	}
}

// An event whose predecessor was withheld is held — nacked, not applied —
// until the gap timeout, then reported (metric, dead letter); once the
// missing event arrives both apply in order.
func TestWithheldEventHoldsThenReportsTheGap(t *testing.T) {
	var mu sync.Mutex
	var dead []string
	c, pool := setup(t, consumer.Config{HoldDelay: 5 * time.Millisecond, GapTimeout: 300 * time.Millisecond,
		DeadLetter: func(_ context.Context, m *message.Message, reason string) error {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, m.UUID+": "+reason)
			return nil
		}})
	ctx := context.Background()
	if got, err := c.Process(ctx, event("e1", "a", "1", 1), apply); got != consumer.Applied || err != nil {
		t.Fatalf("v1: %v, %v", got, err)
	}
	// v2 is withheld; v3 arrives and is redelivered until the gap times out.
	var outcomes []consumer.Outcome
	eventually(t, 30*time.Second, "the gap reported", func() bool {
		got, err := c.Process(ctx, event("e3", "a", "3", 3), apply)
		if got == consumer.Held && !errors.Is(err, consumer.ErrHeld) {
			t.Fatalf("held without ErrHeld: %v", err)
		}
		outcomes = append(outcomes, got)
		return got == consumer.DeadLettered
	})
	if len(outcomes) < 2 || outcomes[0] != consumer.Held {
		t.Fatalf("outcomes %v: want held before the gap timeout", outcomes)
	}
	if f := state(t, pool, "a"); f.n != 1 {
		t.Fatalf("v3 applied out of order: state %+v", f)
	}
	m := c.Metrics()
	if testutil.ToFloat64(m.Gaps) != 1 || testutil.ToFloat64(m.DeadLettered) != 1 || testutil.ToFloat64(m.OpenGaps) != 1 {
		t.Fatalf("gaps %v, dead-lettered %v, open gaps %v", testutil.ToFloat64(m.Gaps), testutil.ToFloat64(m.DeadLettered), testutil.ToFloat64(m.OpenGaps))
	}
	if len(dead) != 1 || !strings.Contains(dead[0], "versions 2..2 missing") {
		t.Fatalf("dead letters %q", dead)
	}
	// The withheld event arrives, and v3 is redelivered from the dead-letter
	// topic: both apply, in order.
	for _, e := range []*message.Message{event("e2", "a", "2", 2), event("e3", "a", "3", 3)} {
		if got, err := c.Process(ctx, e, apply); got != consumer.Applied || err != nil {
			t.Fatalf("%s: %v, %v", e.UUID, got, err)
		}
	}
	if want := (fold{}).apply(1).apply(2).apply(3); state(t, pool, "a") != want {
		t.Fatalf("state %+v, want %+v", state(t, pool, "a"), want)
	}
	if testutil.ToFloat64(m.OpenGaps) != 0 {
		t.Fatalf("open gaps %v after the gap filled", testutil.ToFloat64(m.OpenGaps))
	}
}

// Without a dead letter, a reported gap keeps the event held: never applied
// out of order.
func TestGapWithoutDeadLetterStaysHeld(t *testing.T) {
	c, pool := setup(t, consumer.Config{HoldDelay: time.Millisecond, GapTimeout: 50 * time.Millisecond})
	ctx := context.Background()
	eventually(t, 30*time.Second, "the gap reported", func() bool {
		got, err := c.Process(ctx, event("e2", "a", "2", 2), apply)
		if got != consumer.Held || !errors.Is(err, consumer.ErrHeld) {
			t.Fatalf("v2 without v1: %v, %v", got, err)
		}
		return testutil.ToFloat64(c.Metrics().Gaps) == 1
	})
	for range 3 {
		if got, _ := c.Process(ctx, event("e2", "a", "2", 2), apply); got != consumer.Held {
			t.Fatalf("after the report: %v, want held", got)
		}
	}
	if testutil.ToFloat64(c.Metrics().Gaps) != 1 || state(t, pool, "a").n != 0 {
		t.Fatalf("gaps %v (reported once), state %+v", testutil.ToFloat64(c.Metrics().Gaps), state(t, pool, "a"))
	}
}

// Bad input: an event without the version header is applied without
// ordering and counted; a malformed version is poison, not a guess.
func TestEventsWithoutUsableVersion(t *testing.T) {
	c, _ := setup(t, consumer.Config{})
	ctx := context.Background()
	if got, err := c.Process(ctx, event("u1", "a", "", 1), apply); got != consumer.Applied || err != nil {
		t.Fatalf("no version: %v, %v", got, err)
	}
	if got, err := c.Process(ctx, event("u1", "a", "", 1), apply); got != consumer.Duplicate || err != nil {
		t.Fatalf("no version, redelivered: %v, %v", got, err)
	}
	if n := testutil.ToFloat64(c.Metrics().Unordered); n != 2 {
		t.Fatalf("unordered %v, want 2", n)
	}
	for _, v := range []string{"x", "0", "-3", "1.5"} {
		if got, err := c.Process(ctx, event("bad-"+v, "a", v, 1), apply); got != consumer.Poisoned || err != nil {
			t.Fatalf("version %q: %v, %v; want poisoned", v, got, err)
		}
	}
	if n := testutil.ToFloat64(c.Metrics().Poisoned.WithLabelValues("bad_version")); n != 4 {
		t.Fatalf("poisoned (bad_version) %v, want 4", n)
	}
}

// A handler's error rolls back its changes and the inbox row: the
// redelivery applies the event once.
func TestHandlerErrorRollsBackTheInboxRow(t *testing.T) {
	c, pool := setup(t, consumer.Config{})
	ctx := context.Background()
	boom := errors.New("boom")
	failing := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
		if err := apply(ctx, tx, m); err != nil {
			return err
		}
		return boom
	}
	if _, err := c.Process(ctx, event("e1", "a", "1", 4), failing); !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if got, err := c.Process(ctx, event("e1", "a", "1", 4), apply); got != consumer.Applied || err != nil {
		t.Fatalf("redelivery: %v, %v", got, err)
	}
	if f := state(t, pool, "a"); f != (fold{}).apply(4) {
		t.Fatalf("state %+v", f)
	}
}

func TestPruneInboxByAge(t *testing.T) {
	c, pool := setup(t, consumer.Config{})
	ctx := context.Background()
	for _, id := range []string{"old1", "old2", "new"} {
		if _, err := c.Process(ctx, event(id, "", "", 1), func(context.Context, pgx.Tx, *message.Message) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	pool.Exec(ctx, `UPDATE ferry_inbox SET processed_at = now() - interval '2 days' WHERE event_id LIKE 'old%'`)
	n, err := c.PruneInbox(ctx, 24*time.Hour)
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want 2", n, err)
	}
	var left []string
	rows, _ := pool.Query(ctx, `SELECT event_id FROM ferry_inbox`)
	for rows.Next() {
		var id string
		rows.Scan(&id)
		left = append(left, id)
	}
	if len(left) != 1 || left[0] != "new" {
		t.Fatalf("left %v", left)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  consumer.Config
		want string
	}{
		{consumer.Config{Table: "x;y"}, `table: "x;y" is not a table name`},
		{consumer.Config{HoldDelay: -time.Second}, "hold delay: must not be negative"},
		{consumer.Config{GapTimeout: -time.Second}, "gap timeout: must not be negative"},
		{consumer.Config{HandlerTimeout: -time.Second}, "handler timeout: must not be negative"},
		{consumer.Config{HoldTimeout: -time.Second}, "hold timeout: must not be negative"},
		{consumer.Config{MaxHeld: -1}, "max held: must not be negative"},
		{consumer.Config{Attempts: -1}, "attempts: must not be negative"},
		{consumer.Config{MaxIDLength: 9000}, "max id length: must be from 1 to 2048 bytes"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := consumer.Schema("a.b.c"); err == nil {
		t.Error("Schema accepted a three-part name")
	}
}

// The package is imported alone by consumer services, as a module of its
// own: its go.mod requires nothing of Ferry, and neither it nor its tests
// depend on any Ferry package (internal/layout's test checks the same from
// Ferry's side).
func TestImportsNoOtherFerryPackage(t *testing.T) {
	out, err := exec.Command("go", "mod", "edit", "-json").Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	if mod.Module.Path != "github.com/ferryhq/ferry/consumer" {
		t.Fatalf("module %q, want github.com/ferryhq/ferry/consumer", mod.Module.Path)
	}
	for _, r := range mod.Require {
		if isFerry(r.Path) {
			t.Errorf("go.mod requires %s", r.Path)
		}
	}
	// The module of every package the consumer and its tests link.
	out, err = exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var own int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, module, _ := strings.Cut(line, " ")
		if module == mod.Module.Path {
			own++
		} else if isFerry(module) {
			t.Errorf("consumer depends on %s (module %s)", pkg, module)
		}
	}
	if own == 0 {
		t.Fatalf("go list listed no package of the consumer module:\n%s", out)
	}
}

// isFerry reports whether module is one of Ferry's other than this one.
func isFerry(module string) bool {
	const ferry = "github.com/ferryhq/ferry"
	return module != "github.com/ferryhq/ferry/consumer" && (module == ferry || strings.HasPrefix(module, ferry+"/"))
}

// As Watermill middleware the wrapped handler finds the inbox transaction in
// its message's context, and a redelivered event does not reach it.
func TestMiddlewareRunsTheHandlerInTheInboxTransaction(t *testing.T) {
	c, pool := setup(t, consumer.Config{})
	calls := 0
	h := c.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		calls++
		tx, ok := consumer.Tx(msg.Context())
		if !ok {
			return nil, errors.New("no inbox transaction in the context")
		}
		return nil, apply(msg.Context(), tx, msg)
	})
	for range 2 {
		if _, err := h(event("m1", "a", "1", 8)); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 || state(t, pool, "a") != (fold{}).apply(8) {
		t.Fatalf("handler ran %d times, state %+v", calls, state(t, pool, "a"))
	}
}

// An early event waiting in memory sees another process apply its
// predecessor (the lane re-reads the applied version) and applies without
// going back to the broker.
func TestEarlyEventSeesAnotherProcessApplyTheGap(t *testing.T) {
	a, pool := setup(t, consumer.Config{MaxHeld: 1, HoldTimeout: time.Minute})
	b, err := consumer.New(pool, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type result struct {
		out consumer.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.Process(ctx, event("e2", "x", "2", 2), apply)
		done <- result{out, err}
	}()
	eventually(t, 30*time.Second, "v2 held in memory", func() bool { return testutil.ToFloat64(a.Metrics().HeldInMemory) == 1 })
	if got, err := b.Process(ctx, event("e1", "x", "1", 1), apply); got != consumer.Applied || err != nil {
		t.Fatalf("v1 in the other process: %v, %v", got, err)
	}
	select {
	case r := <-done:
		if r.out != consumer.Applied || r.err != nil {
			t.Fatalf("v2: %v, %v; want applied", r.out, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("v2 still held 30s after v1 was applied")
	}
	if n := testutil.ToFloat64(a.Metrics().HeldNacked); n != 0 {
		t.Errorf("%v held events nacked", n)
	}
	if f := state(t, pool, "x"); f != (fold{}).apply(1).apply(2) {
		t.Errorf("state %+v", f)
	}
}
