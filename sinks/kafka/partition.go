package kafka

import (
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// placedPartition is a partition a transform chose for a record
// (plugins.MetaPartition: Debezium's `partition` placement), carried to the
// partitioner in the producer message's Metadata.
type placedPartition int32

// placing wraps a partitioner so a record with a placed partition goes
// there and every other record is partitioned by key as before.
func placing(next sarama.PartitionerConstructor) sarama.PartitionerConstructor {
	return func(topic string) sarama.Partitioner { return placingPartitioner{next(topic)} }
}

type placingPartitioner struct{ next sarama.Partitioner }

func (p placingPartitioner) Partition(m *sarama.ProducerMessage, n int32) (int32, error) {
	if pp, ok := m.Metadata.(placedPartition); ok {
		if int32(pp) >= n {
			return -1, fmt.Errorf("placed partition %d: topic %s has %d partitions: %w", pp, m.Topic, n, sarama.ErrInvalidPartition)
		}
		return int32(pp), nil
	}
	return p.next.Partition(m, n)
}

// RequiresConsistency is the key partitioner's: a placed partition does
// not depend on the partition count either way.
func (p placingPartitioner) RequiresConsistency() bool { return p.next.RequiresConsistency() }

// placeRecord applies a transform's record-level choices: the partition,
// a null value for a tombstone, the record timestamp.
func placeRecord(pm *sarama.ProducerMessage, msg *message.Message) {
	if v := msg.Metadata.Get(plugins.MetaPartition); v != "" {
		if n, err := strconv.ParseInt(v, 10, 32); err == nil && n >= 0 {
			pm.Metadata = placedPartition(n)
		}
	}
	if msg.Metadata.Get(plugins.MetaTombstone) == "true" {
		pm.Value = nil
	}
	if ts, err := plugins.ParseTime(msg.Metadata.Get(plugins.MetaTimestamp)); err == nil {
		pm.Timestamp = ts
	}
}
