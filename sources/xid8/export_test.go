package xid8

// PendingQuery is the held-back check for table with the default columns.
func PendingQuery(table string) string { return pendingQuery(table, `o."xact_id"`, `o."id"`) }
