package xid8

import (
	"fmt"

	"github.com/ferryhq/ferry/sources/outbox"
)

// Schema returns the DDL for an xid8 outbox table: the default columns, the
// xact_id column, the (xact_id, id) index every read uses, and the optional
// notify trigger.
func Schema(table string) (string, error) {
	if _, _, err := outbox.ParseTable(table); err != nil {
		return "", err
	}
	return outbox.DDL{
		Table:     table,
		ExtraCols: []string{"xact_id        xid8 NOT NULL DEFAULT pg_current_xact_id()"},
		Statements: []string{
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (xact_id, id);", outbox.IndexName(table, "xact_id_id_idx"), outbox.Quote(table)),
			outbox.NotifyTrigger(table, outbox.NotifyChannel(table)),
		},
	}.SQL(), nil
}
