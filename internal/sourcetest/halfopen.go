package sourcetest

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/faultproxy"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestHalfOpenDatabase freezes every connection between the source and
// PostgreSQL for good, without an error — a partition the kernel never
// reports, a NAT or firewall that forgot the connections — while new
// connections work. The source must notice on its own (query_timeout) and
// deliver what commits afterwards; without a bound on each statement it
// waits on a dead connection for ever.
func TestHalfOpenDatabase(t *testing.T, h Harness) {
	h.Extra = strings.TrimSpace(h.Extra + "\nquery_timeout: 2s")
	e := Setup(t, h)
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	y := strings.Replace(e.YAML("halfopen", 100), "dsn: "+e.DSN, "dsn: "+u.String(), 1)
	if !strings.Contains(y, proxy.Addr()) {
		t.Fatalf("the pipeline's dsn does not go through the proxy:\n%s", y)
	}
	e.Start(t, y)
	ctx := context.Background()
	first, err := Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "the first event", func(m []testenv.Received) bool { return len(m) >= 1 })
	proxy.Blackhole()
	proxy.Heal() // the frozen connections stay frozen; new ones work
	start := time.Now()
	second, err := Insert(ctx, e.Pool, "agg-1")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, time.Minute, "the event committed after the connections froze", func(m []testenv.Received) bool { return len(m) >= 2 })
	t.Logf("delivered %s after the connections froze (query_timeout 2s)", time.Since(start).Round(time.Millisecond))
	Check([]Written{first, second}, Decode(t, e.Coll.All()), h.Features.CommitOrder).Assert(t, 0)
}
