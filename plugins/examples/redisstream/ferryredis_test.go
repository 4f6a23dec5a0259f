package redisstream_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/xid8"
)

const ferryRedis = "github.com/ferryhq/ferry/plugins/examples/redisstream/cmd/ferry-redis"

// The custom binary of the plugin guide is built from service alone: it
// links no cmd/ferry/cli, and, run on a pipeline file with `type:
// redis_stream`, it delivers an outbox row to a Redis stream with the
// row's event id, payload and aggregate.
func TestCustomBinaryDeliversToRedis(t *testing.T) {
	deps, err := exec.Command("go", "list", "-deps", ferryRedis).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", ferryRedis, err)
	}
	linked := strings.Fields(string(deps))
	for _, p := range linked {
		if p == "github.com/ferryhq/ferry/cmd/ferry/cli" || strings.HasPrefix(p, "github.com/ferryhq/ferry/cmd/ferry/") {
			t.Errorf("ferry-redis links %s", p)
		}
	}
	if !contains(linked, "github.com/ferryhq/ferry/service") {
		t.Errorf("ferry-redis does not link service: %v", linked)
	}
	bin := filepath.Join(t.TempDir(), "ferry-redis")
	if out, err := exec.Command("go", "build", "-o", bin, ferryRedis).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", ferryRedis, err, out)
	}

	ctx := context.Background()
	dsn := testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ddl, _ := xid8.Schema("outbox")
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	stream := testenv.Name("ferry_redis_binary")
	t.Cleanup(func() { client.Del(context.Background(), stream) })

	dir := t.TempDir()
	y := fmt.Sprintf("name: to-redis\nsource: {type: xid8, dsn: %q, table: outbox, poll_interval: 20ms}\nsink: {type: redis_stream, url: %q, stream: %s}\n",
		dsn, redisURL(), stream)
	if err := os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	cmd := exec.Command(bin, "-c", dir, "--ha=false", "--http", addr, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, type, payload)
		VALUES ('order', 'o-1', 'OrderPlaced', '{"total": 42}') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var entries []redis.XMessage
	testenv.Eventually(t, 30*time.Second, "the event in the Redis stream", func() bool {
		entries, _ = client.XRange(ctx, stream, "-", "+").Result()
		return len(entries) > 0
	})
	if len(entries) != 1 {
		t.Fatalf("%d entries in %s, want 1", len(entries), stream)
	}
	m, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(entries[0].Values)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Payload) != `{"total": 42}` || m.Metadata.Get(plugins.MetaAggregateID) != "o-1" || m.Metadata.Get(plugins.MetaOutboxID) != fmt.Sprint(id) || m.UUID == "" {
		t.Errorf("delivered %s %q %v, want row %d's payload and metadata", m.UUID, m.Payload, m.Metadata, id)
	}

	// It stops as ferry run does: SIGTERM drains and exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Errorf("exit after SIGTERM: %v", exitErr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("still running 20s after SIGTERM")
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
