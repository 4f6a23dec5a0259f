package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/wal"
)

// A database nobody writes to, on a server whose other databases write WAL.
// Without heartbeats the slot's retained WAL shows in the gauge, and the
// source still confirms over the other databases' WAL from the server's
// keepalives. With heartbeats the slot keeps advancing even when no other
// WAL is written at all: the heartbeat messages are the only WAL after the
// point the test waits for.
func TestIdleDatabase(t *testing.T) {
	for _, heartbeat := range []bool{false, true} {
		name := map[bool]string{true: "HeartbeatOn", false: "HeartbeatOff"}[heartbeat]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn, pool := freshOutbox(t)
			other := newPool(t, testenv.Postgres(t))
			if _, err := other.Exec(ctx, `CREATE TABLE filler (x text)`); err != nil {
				t.Fatal(err)
			}
			pipeline := testenv.Name("idle")
			d := startDirect(t, dsn, pipeline, 100, func(c *wal.Config) {
				c.HeartbeatInterval = 0
				if heartbeat {
					c.HeartbeatInterval = 200 * time.Millisecond
				}
			})
			slot := wal.DefaultName(pipeline)
			waitStreaming(t, pool, slot)

			// 4 MB of WAL in another database, in chunks.
			for range 8 {
				if _, err := other.Exec(ctx, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 500)`); err != nil {
					t.Fatal(err)
				}
			}
			end := currentLSN(t, other)
			if !heartbeat {
				testenv.Eventually(t, 60*time.Second, "retained WAL ≥ 1 MB in the gauge", func() bool {
					g, ok := d.gauge(t, "ferry_wal_slot_retained_wal_bytes", map[string]string{"slot": slot})
					return ok && g >= 1<<20
				})
			}
			testenv.Eventually(t, 60*time.Second, "the slot confirmed past the other database's WAL", func() bool {
				return readSlot(t, pool, slot).confirmed >= end
			})
			if heartbeat {
				after := currentLSN(t, other)
				testenv.Eventually(t, 60*time.Second, "the slot confirmed past a heartbeat", func() bool {
					return readSlot(t, pool, slot).confirmed > after
				})
			}
			if n := len(d.messages()); n != 0 {
				t.Fatalf("%d events from an idle database", n)
			}
		})
	}
}
