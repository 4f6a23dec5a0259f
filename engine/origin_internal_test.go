package engine

import (
	"testing"

	"github.com/ferryhq/ferry/plugins"
)

// A component learns the outbox's database and table, read from the DSN
// without resolving anything, and never the DSN's credentials.
func TestOriginOf(t *testing.T) {
	for _, c := range []struct {
		table plugins.OutboxTable
		want  plugins.Origin
	}{
		{plugins.OutboxTable{DSN: "postgres://ferry:hunter2@db:5432/shop?sslmode=disable", Table: "public.outbox"}, plugins.Origin{Database: "shop", Table: "public.outbox"}},
		{plugins.OutboxTable{DSN: "host=db user=ferry password=hunter2 dbname=shop", Table: "outbox"}, plugins.Origin{Database: "shop", Table: "outbox"}},
		{plugins.OutboxTable{DSN: "postgres://db/?dbname=inv", Table: "public.outbox"}, plugins.Origin{Database: "inv", Table: "public.outbox"}},
		{plugins.OutboxTable{DSN: "host=db", Table: "public.outbox"}, plugins.Origin{Table: "public.outbox"}},
	} {
		if got := originOf(c.table); got != c.want {
			t.Errorf("originOf(%s) = %+v, want %+v", c.table.DSN, got, c.want)
		}
	}
}
