package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
)

// logBuffer collects a supervisor's log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(msg string) int { return strings.Count(l.String(), `msg="`+msg+`"`) }

// A WAL row the source cannot decode fails every session right after it
// connects. Reconnecting is not progress: the pipeline stays backing_off
// with the error, is never declared recovered, the pause between attempts
// grows, and the failure is logged once, not once per attempt.
func TestReconnectWithoutProgressIsNotRecovery(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, type text NOT NULL, payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("name: undecodable\nsource: {type: wal, dsn: %q, table: outbox, slot_mode: own}\nsink: {type: nats, url: %q, subject: ferry.test.%s}\n",
		dsn, testenv.NATS(t), testenv.Name("undecodable"))
	specs, err := pipelines.Loader{}.LoadBytes("undecodable.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), DrainTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(runCtx, specs) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 60*time.Second, "the pipeline streaming", func() bool { return logs.count("wal source streaming") >= 1 })
	// A column the pipeline maps disappears from the table while it
	// streams: every session then fails on the relation message, after the
	// connection and the stream came up — a reconnect with no progress.
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox DROP COLUMN headers`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'a1', 'Created', '{}')`); err != nil {
		t.Fatal(err)
	}

	const attempts = 6
	sawRunning := false
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d failed sessions", attempts), func() bool {
		st, err := sup.Status("undecodable")
		if err != nil {
			t.Fatal(err)
		}
		if logs.count("wal source cannot stream; retrying") >= 1 && st.State == engine.StateRunning {
			sawRunning = true
		}
		return logs.count("wal source cannot stream; retrying") >= attempts
	})
	st, _ := sup.Status("undecodable")
	if st.State != engine.StateBackingOff || !strings.Contains(st.LastError, `has no column "headers"`) || st.NextRetry.IsZero() {
		t.Errorf("status %s, last error %q, next retry %v; want backing_off with the decode error and a next retry", st.State, st.LastError, st.NextRetry)
	}
	if sawRunning {
		t.Error("the pipeline showed running between failed sessions")
	}
	if n := logs.count("pipeline recovered"); n != 0 {
		t.Errorf("%d 'pipeline recovered' lines; a reconnect that delivers nothing is not recovery", n)
	}
	if n := logs.count("pipeline failing; retrying with backoff"); n != 1 {
		t.Errorf("the failure was announced %d times; want once per episode", n)
	}
	var waits []time.Duration
	for _, m := range regexp.MustCompile(`msg="wal source cannot stream; retrying".* retry_in=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, d)
	}
	// Jittered by ±50% around a base growing ×1.5: the last of six attempts
	// waits more than any jitter of the first.
	if len(waits) < attempts || waits[len(waits)-1] <= waits[0] {
		t.Errorf("waits between attempts %v; want them to grow", waits)
	}
}
