package xid8_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
)

// sharedSessions is the most server sessions the polling pipelines of one
// database may hold in one process: the shared pool (--db-max-connections,
// default 10) and the LISTEN session.
const sharedSessions = 10 + 1

// Two hundred xid8 pipelines on one database in one process share one pool:
// every one delivers, and Ferry never holds more sessions than the pool and
// the LISTEN session.
func TestManyPipelinesShareOnePool(t *testing.T) {
	h := harness
	h.Extra = "" // the default polling: LISTEN, idle_poll_interval 5s
	const n = 200
	m := relaytest.StartMany(t, relaytest.Setup(t, h), n, nil)
	for i := range n {
		m.Insert(t, i, 1)
	}
	m.WaitArrived(t, 2*time.Minute, 1, relaytest.Range(n), "an event from every pipeline")
	for i := range n {
		m.Insert(t, i, 2)
	}
	m.WaitArrived(t, 2*time.Minute, 2, relaytest.Range(n), "a second event from every pipeline")
	m.Sessions(t)
	if m.MostSessions > sharedSessions {
		t.Fatalf("Ferry held %d server sessions for %d pipelines on one database; want at most %d (the shared pool and LISTEN)",
			m.MostSessions, n, sharedSessions)
	}
	t.Logf("%d pipelines delivered; at most %d server sessions", n, m.MostSessions)
}
