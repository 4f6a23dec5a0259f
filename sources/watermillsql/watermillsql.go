// Package watermillsql drains the tables Watermill's SQL publisher
// (github.com/ThreeDotsLabs/watermill-sql, PostgreSQL schema) writes, as
// they are: each row is published with its original UUID and metadata, and
// rows written through Watermill's components/forwarder are unwrapped and
// published to their destination topic (other rows go to the sink's topic,
// or where an event router sends them). It is the xid8 source on
// watermill-sql's own table layout (its transaction_id xid8 column), so it
// has xid8's guarantees: no row skipped under out-of-order commits, and
// per-key order when the messages carry a partition key in their metadata.
//
// It owns the mapping of watermill-sql's schema and of the forwarder's
// envelope onto Ferry's events; reading, windowing and progress are the xid8
// source's. It imports no sink or transform.
package watermillsql

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Name is the source's registered type.
const Name = "watermill_sql"

// Register adds the source to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSource(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Source, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Config is the `source:` section of a watermill_sql pipeline.
type Config struct {
	// DSN is the PostgreSQL connection string. Required.
	DSN string `yaml:"dsn"`
	// Topic is the Watermill topic the service publishes to; its table is
	// the one watermill-sql's DefaultPostgreSQLSchema names for it
	// (watermill_<topic>). Required.
	Topic string `yaml:"topic"`
	// Schema is the PostgreSQL schema of the table. Default "" (the
	// search_path's, as watermill-sql uses it).
	Schema string `yaml:"schema"`
	// Forwarder: the rows are envelopes written by Watermill's
	// components/forwarder publisher (Topic is then its forwarder topic,
	// "forwarder_topic" by default): each is published to the destination
	// topic it names, with the UUID, payload and metadata it wraps. Default false.
	Forwarder bool `yaml:"forwarder"`
	// PartitionKey is a metadata key whose value orders events: events with
	// the same value are never in flight together and reach the broker in
	// commit order (and it is the Kafka key). Default "partition_key".
	// Messages without it are delivered in parallel.
	PartitionKey string `yaml:"partition_key"`
	// BatchSize is the most rows one read returns. Default 500.
	BatchSize int `yaml:"batch_size"`
	// PollInterval is how often the table is read. Default 100ms.
	PollInterval time.Duration `yaml:"poll_interval"`
	// OffsetsTable stores each pipeline's cursor; created if missing
	// (watermill-sql's own offsets table is not touched). Default "ferry_offsets".
	OffsetsTable string `yaml:"offsets_table"`
	// QueryTimeout bounds each statement and connecting. Default 30s.
	QueryTimeout time.Duration `yaml:"query_timeout"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	x := xid8.DefaultConfig()
	return &Config{PartitionKey: "partition_key", BatchSize: x.BatchSize, PollInterval: x.PollInterval,
		OffsetsTable: x.OffsetsTable, QueryTimeout: x.QueryTimeout}
}

// Table is the watermill-sql table of the topic, as watermill-sql's
// DefaultPostgreSQLSchema names it (unquoted).
func (c *Config) Table() string {
	t := strings.Trim(wsql.DefaultPostgreSQLSchema{}.MessagesTable(c.Topic), `"`)
	if c.Schema != "" {
		return c.Schema + "." + t
	}
	return t
}

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if c.Topic == "" {
		p.Add("topic", "must not be empty")
	} else if _, _, err := outbox.ParseTable(c.Table()); err != nil {
		p.Add("topic", "%q makes the table %s, which Ferry cannot name: %v", c.Topic, c.Table(), err)
	}
	if c.PartitionKey != "" && strings.ContainsAny(c.PartitionKey, "\x00") {
		p.Add("partition_key", "must not contain NUL")
	}
	p = append(p, plugins.Flatten(c.xid8().Validate())...) // dsn, batch_size, … under the same keys
	return p.Err()
}

// xid8 is the xid8 source reading watermill-sql's columns (see its
// schema adapter's CREATE TABLE): "offset" bigserial, uuid varchar(36),
// created_at timestamp, payload json (or bytea), metadata json,
// transaction_id xid8.
func (c *Config) xid8() *xid8.Config {
	x := xid8.DefaultConfig()
	x.DSN, x.Table = c.DSN, c.Table()
	x.XactIDColumn = "transaction_id"
	x.Columns = outbox.Columns{ID: "offset", EventID: "uuid", Payload: "payload", Headers: "metadata", CreatedAt: "created_at"}
	// watermill-sql sends no notifications: poll.
	x.Listen = false
	x.BatchSize, x.PollInterval, x.OffsetsTable, x.QueryTimeout = c.BatchSize, c.PollInterval, c.OffsetsTable, c.QueryTimeout
	key, forwarder := c.PartitionKey, c.Forwarder
	x.Columns.Derive = func(r *outbox.Row) {
		if key != "" {
			r.AggregateID = partitionKey(r, key, forwarder)
		}
		// The metadata as stored, for shape: Ferry's own metadata keys
		// (aggregate_id, created_at, …) must not replace the message's.
		r.ExtraNames = append(r.ExtraNames, rawMetadata)
		r.Extra = append(r.Extra, r.Headers)
	}
	return x
}

// rawMetadata carries a row's metadata column, as stored, to shape.
const rawMetadata = "metadata"

// OutboxTable describes the table (for components that write to it).
func (c *Config) OutboxTable() plugins.OutboxTable { return c.xid8().OutboxTable() }

// HA is the xid8 source's: one instance at a time, locked on the source
// database.
func (c *Config) HA() plugins.HA { return c.xid8().HA() }

var (
	_ plugins.OutboxSource = (*Config)(nil)
	_ plugins.HASource     = (*Config)(nil)
)

// envelope is what Watermill's forwarder publisher stores (components/
// forwarder's messageEnvelope, which is unexported; its JSON is the
// contract, tested against the forwarder's own publisher).
type envelope struct {
	DestinationTopic string            `json:"destination_topic"`
	UUID             string            `json:"uuid"`
	Payload          []byte            `json:"payload"`
	Metadata         map[string]string `json:"metadata"`
}

// partitionKey is the row's ordering key: the metadata value under key, in
// the forwarder's envelope or in the metadata column.
func partitionKey(r *outbox.Row, key string, forwarder bool) outbox.Text {
	var md map[string]string
	if forwarder {
		var e struct {
			Metadata map[string]string `json:"metadata"`
		}
		if json.Unmarshal(r.Payload, &e) != nil {
			return outbox.Text{}
		}
		md = e.Metadata
	} else if r.Headers.Valid {
		if json.Unmarshal([]byte(r.Headers.String), &md) != nil {
			return outbox.Text{}
		}
	}
	v, ok := md[key]
	return outbox.Text{String: v, Valid: ok && v != ""}
}

// Source is the watermill_sql source: the xid8 source on watermill-sql's
// table, unwrapping forwarder envelopes on the way out.
type Source struct {
	*xid8.Source
	cfg       *Config
	closing   chan struct{}
	closeOnce sync.Once
}

// New returns a source; it does no I/O until Subscribe.
func New(cfg *Config, env plugins.Env) *Source {
	return &Source{Source: xid8.New(cfg.xid8(), env), cfg: cfg, closing: make(chan struct{})}
}

// Close stops the source (see xid8.Source.Close). Idempotent.
func (s *Source) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	return s.Source.Close()
}

// Subscribe starts reading. Messages keep the xid8 source's ack contract:
// the same message is passed on, changed in place.
func (s *Source) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Source.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			s.shape(m)
			select {
			case out <- m:
			case <-ctx.Done():
				m.Nack() // nobody reads any more: the xid8 source keeps it for the next start
			case <-s.closing:
				m.Nack()
			}
		}
	}()
	return out, nil
}

// Ferry's descriptive metadata that a watermill-sql row does not have: not
// sent as headers, so consumers see the message's own metadata.
var absent = []string{plugins.MetaAggregateType, plugins.MetaEventType, plugins.MetaAggregateID}

// shape makes the row's message the Watermill message it stores.
func (s *Source) shape(m *message.Message) {
	if m.Metadata.Get(plugins.MetaUndecodable) != "" {
		return
	}
	key := m.Metadata.Get(plugins.MetaAggregateID)
	for _, k := range absent {
		delete(m.Metadata, k)
	}
	raw := m.Metadata.Get(plugins.ColumnKey(rawMetadata))
	delete(m.Metadata, plugins.ColumnKey(rawMetadata))
	if !s.cfg.Forwarder && raw != "" {
		var md map[string]string
		if json.Unmarshal([]byte(raw), &md) == nil {
			for k, v := range md {
				if !plugins.IsInternal(k) {
					m.Metadata.Set(k, v)
				}
			}
		}
	}
	if s.cfg.Forwarder {
		var e envelope
		err := json.Unmarshal(m.Payload, &e)
		if err == nil && e.DestinationTopic == "" {
			err = errors.New("no destination_topic")
		}
		if err != nil {
			m.Metadata.Set(plugins.MetaUndecodable, fmt.Sprintf("watermill forwarder row at position %s is not an envelope: %v; "+
				"is source.forwarder right for topic %s? set dead_letter.topic so that such rows are set aside",
				m.Metadata.Get(plugins.MetaPosition), err, s.cfg.Topic))
			return
		}
		m.UUID, m.Payload = e.UUID, e.Payload
		for k, v := range e.Metadata {
			if !plugins.IsInternal(k) {
				m.Metadata.Set(k, v)
			}
		}
		m.Metadata.Set(plugins.MetaTopic, e.DestinationTopic)
	}
	if key != "" {
		m.Metadata.Set(plugins.MetaKey, key)
	}
}

var _ plugins.Source = (*Source)(nil)
