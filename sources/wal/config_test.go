package wal_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/wal"
)

func TestConfigValidate(t *testing.T) {
	valid := func() *wal.Config {
		c := wal.DefaultConfig()
		c.DSN = "postgres://ferry:secret@db/orders"
		return c
	}
	for _, tc := range []struct {
		name   string
		mutate func(*wal.Config)
		want   []string // "path: message" prefixes, in order
	}{
		{"defaults with a dsn", func(*wal.Config) {}, nil},
		{"every option", func(c *wal.Config) {
			c.Table, c.Publication, c.Slot = "app.outbox", "orders_pub", "orders_slot"
			c.TemporarySlot, c.DropSlotOnStop, c.InitialSnapshot = true, true, false
			c.OnSlotLost, c.HeartbeatInterval, c.StatusInterval, c.MetricsInterval = wal.OnSlotLostRecreate, 0, 30*time.Second, time.Second
		}, nil},
		{"no dsn", func(c *wal.Config) { c.DSN = "" }, []string{"dsn: must not be empty"}},
		{"bad dsn", func(c *wal.Config) { c.DSN = "postgres://ferry:secret@h:notaport/db" }, []string{"dsn: not a PostgreSQL connection string"}},
		{"bad table", func(c *wal.Config) { c.Table = "a.b.c" }, []string{"table: "}},
		{"bad column", func(c *wal.Config) { c.Columns.ID = "id; drop" }, []string{"columns.id: "}},
		{"slot with upper case", func(c *wal.Config) { c.Slot = "Orders" }, []string{"slot: \"Orders\""}},
		{"publication with a dash", func(c *wal.Config) { c.Publication = "a-b" }, []string{"publication: \"a-b\""}},
		{"on_slot_lost", func(c *wal.Config) { c.OnSlotLost = "ignore" }, []string{"on_slot_lost: want \"fail\" or \"recreate\""}},
		{"negative heartbeat", func(c *wal.Config) { c.HeartbeatInterval = -time.Second }, []string{"heartbeat_interval: "}},
		{"status interval beyond wal_sender_timeout/2", func(c *wal.Config) { c.StatusInterval = time.Minute }, []string{"status_interval: "}},
		{"slot check interval", func(c *wal.Config) { c.MetricsInterval = 0 }, []string{"metrics_interval: "}},
		{"shared", func(c *wal.Config) { c.SlotMode, c.InitialSnapshot = wal.SlotModeShared, false }, nil},
		{"shared with its initial snapshot", func(c *wal.Config) { c.SlotMode = wal.SlotModeShared }, nil},
		{"slot_mode", func(c *wal.Config) { c.SlotMode = "per-database" }, []string{"slot_mode: want \"own\" or \"shared\""}},
		{"shared with what a shared slot cannot do", func(c *wal.Config) {
			c.SlotMode, c.TemporarySlot, c.DropSlotOnStop, c.OnSlotLost = wal.SlotModeShared, true, true, wal.OnSlotLostRecreate
		}, []string{"temporary_slot: ", "drop_slot_on_stop: ", "on_slot_lost: "}},
		{"all at once", func(c *wal.Config) { c.DSN, c.Slot, c.StatusInterval = "", "x-y", 0 },
			[]string{"dsn: ", "slot: ", "status_interval: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(c)
			errs := plugins.Flatten(c.Validate())
			if len(errs) != len(tc.want) {
				t.Fatalf("got %v, want %d problems %v", errs, len(tc.want), tc.want)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tc.want[i]) {
					t.Errorf("problem %d: %q, want prefix %q", i, e, tc.want[i])
				}
				if strings.Contains(e.Error(), "secret") {
					t.Errorf("problem %q shows the password", e)
				}
			}
		})
	}
}

func TestConfigFromYAML(t *testing.T) {
	const doc = `name: orders-outbox
source:
  type: wal
  dsn: postgres://ferry@db/orders
  table: public.outbox
  heartbeat_interval: 30s
  on_slot_lost: recreate
sink:
  type: nats
  subject: outbox.orders
`
	specs, err := pipelines.Loader{}.LoadBytes("orders.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	c := specs[0].Source.Config.(*wal.Config)
	if c.HeartbeatInterval != 30*time.Second || c.OnSlotLost != "recreate" || c.StatusInterval != 200*time.Millisecond ||
		!c.InitialSnapshot || c.Slot != "" || c.Columns.ID != "id" {
		t.Fatalf("decoded %+v", c)
	}
	if got := wal.DefaultName("orders-outbox"); got != "ferry_orders_outbox" {
		t.Fatalf("default slot and publication name %q", got)
	}
	if got := wal.SharedName("Orders-EU"); got != "ferry_shared_orders_eu" {
		t.Fatalf("default shared slot and publication name %q", got)
	}
	if c.SlotMode != "" {
		t.Fatalf("default slot_mode %q, want unset (decided by the rest of the section)", c.SlotMode)
	}

	_, err = pipelines.Loader{}.LoadBytes("orders.yaml", []byte(strings.Replace(doc, "  on_slot_lost", "  on_slot_lots", 1)))
	if err == nil || !strings.Contains(err.Error(), "source.on_slot_lots: unknown key") || !strings.Contains(err.Error(), "on_slot_lost") {
		t.Fatalf("unknown key: %v", err)
	}
}

// slot_mode defaults to shared, unless the section asks for what only a
// slot of its own honours; set, it is what it says. The fleet places a
// shared pipeline with its slot's other members (HA().Unit).
func TestDefaultSlotMode(t *testing.T) {
	for _, tc := range []struct {
		yaml   string
		shared bool
	}{
		{"", true},
		{"initial_snapshot: false", true},
		{"on_slot_lost: fail", true},
		{"slot: orders_slot", false},
		{"publication: orders_pub", false},
		{"temporary_slot: true", false},
		{"drop_slot_on_stop: true", false},
		{"on_slot_lost: recreate", false},
		{"slot_mode: own", false},
		{"slot_mode: shared\n  slot: orders_slot", true},
	} {
		doc := "name: orders\nsource:\n  type: wal\n  dsn: postgres://ferry@db:5433/orders\n  " + tc.yaml + "\nsink:\n  type: nats\n  subject: s\n"
		specs, err := pipelines.Loader{}.LoadBytes("orders.yaml", []byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		unit := specs[0].Source.Config.(*wal.Config).HA().Unit
		if shared := unit != ""; shared != tc.shared {
			t.Errorf("%q: shared %v (unit %q), want %v", tc.yaml, shared, unit, tc.shared)
		}
		if tc.yaml == "" && unit != "wal shared slot ferry_shared_orders on db:5433/orders" {
			t.Errorf("default unit %q", unit)
		}
	}
}

// The supervisor finds metrics_interval through plugins.HealthIntervaler,
// on the config as the loader decodes it.
func TestHealthInterval(t *testing.T) {
	for yaml, want := range map[string]time.Duration{"": 15 * time.Second, "  metrics_interval: 2s\n": 2 * time.Second} {
		specs, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte("name: p\nsource:\n  type: wal\n  dsn: postgres://db/orders\n"+yaml+"sink:\n  type: nats\n  subject: s\n"))
		if err != nil {
			t.Fatal(err)
		}
		hi, ok := specs[0].Source.Config.(plugins.HealthIntervaler)
		if !ok || hi.HealthInterval() != want {
			t.Errorf("source section %q: HealthIntervaler %v, want %s", yaml, hi, want)
		}
	}
}
