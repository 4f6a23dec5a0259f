package pgsource

import "testing"

func TestConnections(t *testing.T) {
	for _, c := range []struct {
		want, limit int
		pool        int32
	}{{3, 0, 3}, {3, 10, 3}, {3, 3, 3}, {3, 2, 2}, {3, 1, 1}} {
		if got := Connections(c.want, c.limit); got != c.pool {
			t.Errorf("Connections(%d, %d) = %d, want %d", c.want, c.limit, got, c.pool)
		}
	}
}
