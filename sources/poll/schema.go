package poll

import (
	"fmt"

	"github.com/ferryhq/ferry/sources/outbox"
)

// Schema returns the DDL for a poll outbox table: the default columns, the
// delivery bookkeeping columns, the partial index that keeps every claim
// cheap however much published history the table holds, and the optional
// notify trigger.
func Schema(table string) (string, error) {
	if _, _, err := outbox.ParseTable(table); err != nil {
		return "", err
	}
	return outbox.DDL{
		Table: table,
		Statements: []string{
			fmt.Sprintf(`-- Delivery bookkeeping; ADD COLUMN IF NOT EXISTS also upgrades an existing outbox.
ALTER TABLE %[1]s
  ADD COLUMN IF NOT EXISTS published_at  timestamptz,
  ADD COLUMN IF NOT EXISTS claimed_until timestamptz,
  ADD COLUMN IF NOT EXISTS claimed_by    text,
  ADD COLUMN IF NOT EXISTS attempts      int NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS last_error    text;`, outbox.Quote(table)),
			fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (id) WHERE published_at IS NULL;",
				outbox.IndexName(table, "unpublished_idx"), outbox.Quote(table)),
			outbox.NotifyTrigger(table, outbox.NotifyChannel(table)),
		},
	}.SQL(), nil
}
