package xid8_test

import (
	"testing"

	"github.com/ferryhq/ferry/internal/sourcetest"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestMain(m *testing.M) { sourcetest.Main(m) }

var harness = sourcetest.Harness{
	Type:   xid8.Name,
	Schema: xid8.Schema,
	Extra:  "poll_interval: 20ms",
	Features: sourcetest.Features{
		CommitOrder:                true,
		HoldsBehindOpenTransaction: true,
	},
}

func TestConformance(t *testing.T) { sourcetest.Run(t, harness) }
