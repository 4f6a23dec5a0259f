package outbox

import "testing"

// limits.max_connections counts the listener's connection, which leaves the
// pool for good: the pool gets one fewer, and a limit of 1 leaves no room to
// listen.
func TestConnections(t *testing.T) {
	for _, c := range []struct {
		want, limit int
		listen      bool
		pool        int32
		listening   bool
	}{
		{3, 0, true, 3, true},
		{3, 0, false, 3, false},
		{3, 10, true, 3, true},
		{3, 3, true, 2, true},
		{3, 2, true, 1, true},
		{3, 1, true, 1, false},
		{3, 2, false, 2, false},
	} {
		pool, listening := Connections(c.want, c.limit, c.listen)
		if pool != c.pool || listening != c.listening {
			t.Errorf("Connections(%d, %d, %v) = %d, %v; want %d, %v", c.want, c.limit, c.listen, pool, listening, c.pool, c.listening)
		}
	}
}
