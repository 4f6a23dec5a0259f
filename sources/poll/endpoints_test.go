package poll

import (
	"testing"

	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// The poll source always removes rows from other poll readers' view
// (marks, deletes, or ages them out), named by the key that says how.
func TestEndpointsRetention(t *testing.T) {
	for _, c := range []struct {
		onDelivered string
		retention   *pgsource.Retention
		path        string
	}{
		{DeliveredMark, nil, "on_delivered"},
		{DeliveredDelete, nil, "on_delivered"},
		{DeliveredMark, &pgsource.Retention{}, "retention"},
	} {
		cfg := DefaultConfig()
		cfg.DSN, cfg.OnDelivered, cfg.Retention = "postgres://u@db/orders", c.onDelivered, c.retention
		eps, err := cfg.Endpoints()
		if err != nil || len(eps) != 1 || !eps[0].Retention || eps[0].RetentionPath != c.path || eps[0].Table != "outbox" {
			t.Errorf("on_delivered %s, retention %v: %+v, %v; want retention at %s", c.onDelivered, c.retention != nil, eps, err, c.path)
		}
	}
}
