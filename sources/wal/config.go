package wal

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// What to do when the replication slot was invalidated or dropped.
const (
	// OnSlotLostFail stops the pipeline with an error (the default): events
	// may have been missed and a person has to decide what to do about them.
	OnSlotLostFail = "fail"
	// OnSlotLostRecreate drops the lost slot and creates a new one, logging at
	// error level that events may have been missed.
	OnSlotLostRecreate = "recreate"
)

// How a pipeline's events are read from the server.
const (
	// SlotModeOwn gives the pipeline a replication slot, a publication and a
	// walsender of its own.
	SlotModeOwn = "own"
	// SlotModeShared makes the pipeline a member of its database's shared
	// stream: one slot, one publication and one walsender for every shared
	// pipeline of the process on that database (see shared.go). The
	// default, unless the pipeline asks for what only a slot of its own
	// can do (see Config.mode).
	SlotModeShared = "shared"
)

// SharedName is the default slot and publication name of the shared
// stream on database: "ferry_shared_<database>", lowercase, other
// characters than letters, digits and _ replaced by _, cut at 63. Slot
// names are the server's, not the database's: the database in the name
// keeps the shared streams of two databases on one server apart.
func SharedName(database string) string {
	b := []byte("ferry_shared_" + strings.ToLower(database))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b[:min(len(b), 63)])
}

// Config is the `source:` section of a wal pipeline.
type Config struct {
	pgsource.Outbox `yaml:",inline"`
	// Publication is the publication the slot streams; created for Table
	// (inserts only) when missing. Default "ferry_shared_<database>" (slot_mode
	// shared, which adds each member's table to it), or "ferry_<pipeline>"
	// ("-" becomes "_") with slot_mode own. Setting it, without slot_mode,
	// gives the pipeline a slot of its own. A tenant's pipeline names only
	// publications under its prefix, ferry_<tenant>_ ("-" becomes "_").
	Publication string `yaml:"publication"`
	// Slot is the logical replication slot (plugin pgoutput); created when
	// missing. Default "ferry_shared_<database>" (slot_mode shared), or
	// "ferry_<pipeline>" ("-" becomes "_") with slot_mode own. Setting it,
	// without slot_mode, gives the pipeline a slot of its own. A tenant's
	// pipeline names only slots under its prefix, ferry_<tenant>_, and
	// never shares a slot with another tenant's.
	Slot string `yaml:"slot"`
	// SlotMode is "own" (a slot, publication and walsender per pipeline) or
	// "shared" (the pipelines of a process on one database, with the same
	// slot and publication names, share one slot, one publication and one
	// walsender; each keeps its own progress). Default "shared", or "own"
	// when the pipeline sets slot, publication, temporary_slot,
	// drop_slot_on_stop or on_slot_lost: recreate, which only a slot of its
	// own honours. A pipeline that ran with a slot of its own (ferry_<pipeline>)
	// moves to the shared slot by itself, losing and repeating no event.
	SlotMode string `yaml:"slot_mode"`
	// SplitAfterBytes bounds what a stopped or paused member of a shared
	// stream holds: once it is more than this many bytes of WAL behind, it
	// gets a slot of its own, a copy of the shared slot advanced to its
	// position, and the shared slot is no longer held for it; it moves back
	// when it runs again. A setting of the stream (the first member's, like
	// status_interval). 0 holds the shared slot for it without bound.
	// Default 1073741824 (1 GiB).
	SplitAfterBytes int64 `yaml:"split_after_bytes"`
	// TemporarySlot uses a slot that PostgreSQL drops when Ferry disconnects:
	// nothing is retained while Ferry is down, and nothing committed meanwhile
	// is delivered. For development. Default false.
	TemporarySlot bool `yaml:"temporary_slot"`
	// DropSlotOnStop drops the slot when the pipeline stops gracefully, so a
	// stopped pipeline retains no WAL; events committed until the next start
	// are not delivered. Default false.
	DropSlotOnStop bool `yaml:"drop_slot_on_stop"`
	// OnSlotLost is "fail" (stop with an error) or "recreate" (drop the lost
	// slot, create a new one, log that events may have been missed). Default "fail".
	OnSlotLost string `yaml:"on_slot_lost"`
	// InitialSnapshot makes the first start (no slot yet; with slot_mode
	// shared, no row in the members table yet) also deliver the rows
	// already in the outbox table, read in one snapshot, so that nothing
	// committed before the pipeline started is skipped. Default true.
	InitialSnapshot bool `yaml:"initial_snapshot"`
	// HeartbeatInterval is how often a pg_logical_emit_message is written to
	// the source database so the slot of a quiet database keeps advancing
	// while other databases on the server write WAL. 0 turns it off. Default 1m.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// StatusInterval is how often the confirmed LSN is sent to the server
	// (sooner when half of max_in_flight waits on it, and at once when the
	// server asks). A crash re-sends what was acked since the last one, so
	// it is short; it must stay well below the server's wal_sender_timeout.
	// Default 200ms.
	StatusInterval time.Duration `yaml:"status_interval"`
	// MetricsInterval is how often the slot's health (unconfirmed and
	// retained WAL, wal_status, safe_wal_size) and the oldest undelivered
	// event's age are measured. Default 15s.
	MetricsInterval time.Duration `yaml:"metrics_interval"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		Outbox:            pgsource.DefaultOutbox(),
		OnSlotLost:        OnSlotLostFail,
		SplitAfterBytes:   1 << 30,
		InitialSnapshot:   true,
		HeartbeatInterval: time.Minute,
		StatusInterval:    200 * time.Millisecond,
		MetricsInterval:   15 * time.Second,
	}
}

// slotName is what PostgreSQL accepts as a replication slot name; Ferry
// holds publication names to the same rule so that no quoting question arises.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	c.Outbox.Validate(&p)
	if c.Columns.ID == "" && c.Columns.EventID == "" && c.InitialSnapshot {
		p.Add("columns.id", `is "" (no id column): the initial snapshot must recognise the rows the stream sends again; `+
			"map columns.event_id, or set initial_snapshot: false")
	}
	if c.Publication != "" && !slotName.MatchString(c.Publication) {
		p.Add("publication", "%q: want lowercase letters, digits and _, at most 63", c.Publication)
	}
	if c.Slot != "" && !slotName.MatchString(c.Slot) {
		p.Add("slot", "%q: want lowercase letters, digits and _, at most 63", c.Slot)
	}
	if c.OnSlotLost != OnSlotLostFail && c.OnSlotLost != OnSlotLostRecreate {
		p.Add("on_slot_lost", "want %q or %q, got %q", OnSlotLostFail, OnSlotLostRecreate, c.OnSlotLost)
	}
	c.validateShared(&p)
	if c.SplitAfterBytes < 0 {
		p.Add("split_after_bytes", "must be 0 (never split) or a number of bytes, got %d", c.SplitAfterBytes)
	}
	if c.HeartbeatInterval < 0 || (c.HeartbeatInterval > 0 && c.HeartbeatInterval < 100*time.Millisecond) {
		p.Add("heartbeat_interval", "must be 0 (off) or at least 100ms, got %s", c.HeartbeatInterval)
	}
	// wal_sender_timeout defaults to 60s; the server drops a client that is
	// silent for that long, so status updates must come well within it.
	if c.StatusInterval < 10*time.Millisecond || c.StatusInterval > 30*time.Second {
		p.Add("status_interval", "must be between 10ms and 30s, got %s", c.StatusInterval)
	}
	if c.MetricsInterval < 100*time.Millisecond {
		p.Add("metrics_interval", "must be at least 100ms, got %s", c.MetricsInterval)
	}
	return p.Err()
}

// validateShared checks slot_mode and what the shared stream cannot do:
// a shared slot outlives every member, so it is never temporary nor
// dropped by one of them, nor recreated by one of them.
func (c *Config) validateShared(p *plugins.Problems) {
	switch c.SlotMode {
	case "", SlotModeOwn:
		return
	case SlotModeShared:
	default:
		p.Add("slot_mode", "want %q or %q, got %q", SlotModeOwn, SlotModeShared, c.SlotMode)
		return
	}
	if c.TemporarySlot {
		p.Add("temporary_slot", "must be false with slot_mode: shared (the shared slot outlives its members)")
	}
	if c.DropSlotOnStop {
		p.Add("drop_slot_on_stop", "must be false with slot_mode: shared (other pipelines stream the shared slot)")
	}
	if c.OnSlotLost != OnSlotLostFail {
		p.Add("on_slot_lost", "must be %q with slot_mode: shared (recreating the slot would skip events of every member)", OnSlotLostFail)
	}
}

// mode is the slot_mode the pipeline runs with: the one set, else shared
// unless the pipeline set what only a slot of its own honours. Naming the
// slot or the publication counts: such a pipeline was set up by hand
// around its own slot (a publication made for it, a slot someone
// watches), which the shared stream would not use.
func (c *Config) mode() string {
	if c.SlotMode != "" {
		return c.SlotMode
	}
	if c.Slot != "" || c.Publication != "" || c.TemporarySlot || c.DropSlotOnStop || c.OnSlotLost == OnSlotLostRecreate {
		return SlotModeOwn
	}
	return SlotModeShared
}

// shared reports whether the pipeline is a member of a shared stream.
func (c *Config) shared() bool { return c.mode() == SlotModeShared }

var _ plugins.OutboxSource = (*Config)(nil)

// HA: the ownership lock lives on the source database; a replication slot
// streams to one instance at a time, so the members of a shared slot are one
// unit: the instance that streams the slot runs all of them.
func (c *Config) HA() plugins.HA {
	ha := plugins.HA{LockDSN: c.DSN}
	if c.shared() {
		slot, _ := c.names("")
		where := "?"
		if pc, err := pgconn.ParseConfig(c.DSN); err == nil {
			where = fmt.Sprintf("%s:%d/%s", pc.Host, pc.Port, pc.Database)
		}
		ha.Unit = "wal shared slot " + slot + " on " + where
	}
	return ha
}

// HealthInterval is metrics_interval: how often the slot is measured.
func (c *Config) HealthInterval() time.Duration { return c.MetricsInterval }

var (
	_ plugins.OutboxSource     = (*Config)(nil)
	_ plugins.HASource         = (*Config)(nil)
	_ plugins.HealthIntervaler = (*Config)(nil)
)

// names are the slot and publication the pipeline streams: the configured
// ones, else the defaults of its slot_mode.
func (c *Config) names(pipeline string) (slot, publication string) {
	slot, publication = c.Slot, c.Publication
	def := DefaultName(pipeline)
	if c.shared() {
		def = SharedName("")
		if pc, err := pgconn.ParseConfig(c.DSN); err == nil {
			def = SharedName(pc.Database)
		}
	}
	if slot == "" {
		slot = def
	}
	if publication == "" {
		publication = def
	}
	return slot, publication
}

// DefaultName is the default slot and publication name of a pipeline:
// "ferry_<pipeline>" with "-" replaced by "_" (slot names allow neither "-"
// nor upper case).
func DefaultName(pipeline string) string {
	n := "ferry_" + strings.ReplaceAll(strings.ToLower(pipeline), "-", "_")
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// ReplicationObjects are the slot and publication names the pipeline may
// create, stream, advance, alter or drop (the tenant policy checks that no
// other tenant's pipeline uses one): its slot and publication; with a slot
// of its own, the initial snapshot's temporary slot (bootSlotName); for a
// shared member, the slot and publication of its own it moves off (a
// former slot_mode: own) or is split onto (DefaultName).
func (c *Config) ReplicationObjects(pipeline string) (slots, publications []string) {
	slot, publication := c.names(pipeline)
	slots, publications = []string{slot}, []string{publication}
	if !c.shared() {
		return append(slots, bootSlotName(slot)), publications
	}
	if own := DefaultName(pipeline); own != slot {
		slots, publications = append(slots, own), append(publications, own)
	}
	return slots, publications
}

// NamedReplicationObjects are the slot and publication names the YAML sets,
// by key: a tenant's must fall under its prefix (policy.TenantPrefix).
func (c *Config) NamedReplicationObjects() map[string]string {
	return map[string]string{"slot": c.Slot, "publication": c.Publication}
}
