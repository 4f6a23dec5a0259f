// Package watermillsql drains the tables Watermill's SQL publisher
// (github.com/ThreeDotsLabs/watermill-sql, PostgreSQL schema) writes, as
// they are: each row is published with its original UUID and metadata, and
// rows written through Watermill's components/forwarder are unwrapped and
// published to their destination topic (other rows go to the sink's topic,
// or where an event router sends them). It is the xid8 source on
// watermill-sql's own table layout (its transaction_id xid8 column), so it
// has xid8's guarantees: no row skipped under out-of-order commits, and
// per-key order when the messages carry a partition key in their metadata;
// messages without one keep per-topic order by default, as the forwarder
// published them.
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
	// (watermill_<topic>). Required; letters, digits and _ (watermill-sql
	// also allows . - $ :, which Ferry cannot name a table with yet).
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
	// transaction-id order (and it is the Kafka key). Default
	// "partition_key". Messages without it are ordered as unkeyed_order
	// says; "" orders every message that way (by topic, as the forwarder
	// did).
	PartitionKey string `yaml:"partition_key"`
	// UnkeyedOrder orders the messages without a partition key: "topic"
	// keeps each topic's messages in transaction-id order, as Watermill's
	// forwarder published them (one message of the topic in flight at a
	// time, and the topic name is their Kafka key, so they share one
	// partition); "none" delivers them in parallel, in no order, with no
	// key. The topic is the envelope's destination with forwarder, else
	// topic. Default "topic".
	UnkeyedOrder string `yaml:"unkeyed_order"`
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

// The values of Config.UnkeyedOrder.
const (
	// UnkeyedOrderTopic orders messages without a partition key per topic.
	UnkeyedOrderTopic = "topic"
	// UnkeyedOrderNone delivers messages without a partition key in
	// parallel.
	UnkeyedOrderNone = "none"
)

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	x := xid8.DefaultConfig()
	return &Config{PartitionKey: "partition_key", UnkeyedOrder: UnkeyedOrderTopic, BatchSize: x.BatchSize, PollInterval: x.PollInterval,
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
	} else if _, table, err := outbox.ParseTable(c.Table()); err != nil {
		p.Add("topic", "%q makes the table %s, which Ferry cannot name: %v", c.Topic, c.Table(), err)
	} else if want := strings.Trim(wsql.DefaultPostgreSQLSchema{}.MessagesTable(c.Topic), `"`); table != want {
		// A dot in the topic (watermill-sql allows it) would make Ferry
		// read a table of another schema than watermill-sql writes.
		p.Add("topic", "%q makes the table %q, which Ferry cannot name: want letters, digits and _", c.Topic, want)
	}
	if c.PartitionKey != "" && strings.ContainsAny(c.PartitionKey, "\x00") {
		p.Add("partition_key", "must not contain NUL")
	}
	if c.UnkeyedOrder != UnkeyedOrderTopic && c.UnkeyedOrder != UnkeyedOrderNone {
		p.Add("unkeyed_order", "%q: must be %s or %s", c.UnkeyedOrder, UnkeyedOrderTopic, UnkeyedOrderNone)
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
	ord := ordering{key: c.PartitionKey, forwarder: c.Forwarder, byTopic: c.UnkeyedOrder == UnkeyedOrderTopic, topic: c.Topic}
	x.Columns.Derive = func(r *outbox.Row) {
		// The ordering key is the aggregate id: the window keeps one
		// message of it in flight, and the sink keys the message by it.
		r.AggregateID = ord.of(r)
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

// ordering derives a row's ordering key.
type ordering struct {
	key       string // the partition key's metadata key; "" for none
	forwarder bool   // the rows are forwarder envelopes
	byTopic   bool   // unkeyed rows are ordered by their topic
	topic     string // the Watermill topic of the table
}

// of is the row's ordering key: the metadata value under the partition
// key, in the forwarder's envelope or in the metadata column; else, when
// unkeyed messages keep topic order, the message's topic (the envelope's
// destination, or the table's Watermill topic), so that each topic's
// unkeyed messages form one lane, as the forwarder published them one
// after another. A partition key equal to a topic's name shares that
// topic's lane: it is then serialized with it, never reordered.
//
// An envelope that does not parse has no key: shape makes it a dead letter.
func (o ordering) of(r *outbox.Row) outbox.Text {
	var md map[string]string
	topic := o.topic
	if o.forwarder {
		var e struct {
			DestinationTopic string            `json:"destination_topic"`
			Metadata         map[string]string `json:"metadata"`
		}
		if json.Unmarshal(r.Payload, &e) != nil {
			return outbox.Text{}
		}
		md, topic = e.Metadata, e.DestinationTopic
	} else if r.Headers.Valid && o.key != "" {
		if json.Unmarshal([]byte(r.Headers.String), &md) != nil {
			md = nil // unreadable metadata: unkeyed
		}
	}
	if v := md[o.key]; o.key != "" && v != "" {
		return outbox.Text{String: v, Valid: true}
	}
	if o.byTopic && topic != "" {
		return outbox.Text{String: topic, Valid: true}
	}
	return outbox.Text{}
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
