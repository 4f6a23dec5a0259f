package xid8

import (
	"testing"

	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// The xid8 source deletes rows only with retention set.
func TestEndpointsRetention(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DSN = "postgres://u@db/orders"
	eps, err := cfg.Endpoints()
	if err != nil || len(eps) != 1 || eps[0].Retention || eps[0].RetentionPath != "" {
		t.Errorf("without retention: %+v, %v", eps, err)
	}
	cfg.Retention = &pgsource.Retention{}
	eps, err = cfg.Endpoints()
	if err != nil || len(eps) != 1 || !eps[0].Retention || eps[0].RetentionPath != "retention" {
		t.Errorf("with retention: %+v, %v", eps, err)
	}
}
