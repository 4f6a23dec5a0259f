package plugins

// Record-level metadata a transform sets for sinks that support it.
const (
	// MetaPartition, set by a transform to a whole number, is the Kafka
	// partition the record goes to (Debezium's `partition` placement);
	// other sinks ignore it.
	MetaPartition = InternalPrefix + "partition"
	// MetaTombstone, set to "true" by a transform, makes the Kafka record's
	// value null (a tombstone, for compacted topics); other sinks send an
	// empty body.
	MetaTombstone = InternalPrefix + "tombstone"
	// MetaTimestamp, set by a transform to a time (FormatTime), is the
	// Kafka record's timestamp (Debezium: the event's timestamp); without
	// it the producer's clock stamps the record. Other sinks ignore it.
	MetaTimestamp = InternalPrefix + "timestamp"
)
