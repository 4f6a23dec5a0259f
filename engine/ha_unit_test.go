package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
)

// instance is one member of a test fleet that the test can stop.
type instance struct {
	name string
	sup  *engine.Supervisor
	logs *logBuffer
	stop func()
}

func startInstance(t *testing.T, name, coordination, yaml string) *instance {
	t.Helper()
	specs, err := pipelines.Loader{}.LoadBytes("fleet.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), Metrics: prometheus.NewRegistry(), DrainTimeout: 5 * time.Second,
		Ownership: &engine.Ownership{Instance: name, CoordinationDSN: coordination, Interval: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, specs) }()
	in := &instance{name: name, sup: sup, logs: logs}
	stopped := false
	in.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(in.stop)
	return in
}

// runsOn is the instance of fleet running pipeline name (running there and
// nowhere else), or "" while that is not so.
func runsOn(fleet []*instance, name string) string {
	where := ""
	for _, in := range fleet {
		for _, st := range in.sup.LocalStatuses() {
			if st.Name == name && st.State == engine.StateRunning {
				if where != "" {
					return "" // on two at once: not settled
				}
				where = in.name
			}
		}
	}
	return where
}

// The wal pipelines sharing one replication slot are one unit of a fleet:
// one instance runs all of them (only one walsender can stream the slot),
// the unit counts once in the fair share, and when that instance stops the
// unit moves whole, delivering every event once and in order.
func TestFleetPlacesASharedSlotAsOneUnit(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	const members, owns = 4, 2
	var docs []string
	for i := range members + owns {
		table := fmt.Sprintf("outbox_%d", i)
		ddl, err := wal.Schema(table)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Pool.Exec(context.Background(), ddl); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("member-%d", i)
		e.H.Extra = "initial_snapshot: false" // slot_mode: the default, shared
		if i >= members {
			name, e.H.Extra = fmt.Sprintf("own-%d", i), "slot_mode: own\ninitial_snapshot: false"
		}
		docs = append(docs, strings.Replace(e.YAML(name, 100), "table: outbox\n", "table: "+table+"\n", 1))
	}
	yaml := strings.Join(docs, "---\n")
	sharedSlot := wal.SharedName(e.Pool.Config().ConnConfig.Database)
	var fleet []*instance
	for _, name := range []string{"a", "b", "c"} {
		fleet = append(fleet, startInstance(t, name, e.DSN, yaml))
	}

	// settled is where the members run, once every pipeline runs on one
	// instance, the members on the same one, alone there (three units,
	// three instances: one each).
	settled := func(fleet []*instance) string {
		on := map[string]int{}
		memberOn := ""
		for i := range members + owns {
			name := fmt.Sprintf("member-%d", i)
			if i >= members {
				name = fmt.Sprintf("own-%d", i)
			}
			where := runsOn(fleet, name)
			if where == "" {
				return ""
			}
			on[where]++
			if i < members {
				if memberOn != "" && memberOn != where {
					return ""
				}
				memberOn = where
			}
		}
		if len(fleet) == 3 && on[memberOn] != members {
			return "" // the unit shares its instance: it counted as four
		}
		return memberOn
	}
	var owner string
	testenv.Eventually(t, 90*time.Second, "the shared slot's members together on one instance, one unit per instance", func() bool {
		owner = settled(fleet)
		return owner != ""
	})

	// Running is not joined yet: what commits before a member's row
	// exists is not its to deliver (initial_snapshot: false).
	joined := func() {
		testenv.Eventually(t, 60*time.Second, "every member joined", func() bool {
			var rows int
			_ = e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+wal.MembersTable).Scan(&rows)
			return rows == members
		})
		waitSlot(t, e, sharedSlot)
		for i := members; i < members+owns; i++ {
			waitSlot(t, e, wal.DefaultName(fmt.Sprintf("own-%d", i)))
		}
	}
	joined()

	seq := map[string]int{}
	write := func(n int) {
		for range n {
			for i := range members + owns {
				table := fmt.Sprintf("outbox_%d", i)
				seq[table]++
				if _, err := e.Pool.Exec(context.Background(), `INSERT INTO `+table+` (aggregate_type, aggregate_id, type, payload)
					VALUES ('order', $1, 'OrderUpdated', jsonb_build_object('agg', $1::text, 'seq', $2::int))`, table, seq[table]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	total := func() int {
		n := 0
		for _, s := range seq {
			n += s
		}
		return n
	}
	write(10)
	e.Coll.WaitFor(t, 60*time.Second, "the first events of every pipeline", func(m []testenv.Received) bool { return len(m) >= total() })

	var sharedSlots int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name LIKE 'ferry_shared_%'`).Scan(&sharedSlots); err != nil {
		t.Fatal(err)
	}
	if sharedSlots != 1 {
		t.Errorf("%d active shared slots; want 1", sharedSlots)
	}
	for _, in := range fleet {
		if in.name == owner && in.logs.count("took ownership of a unit") == 0 {
			t.Errorf("instance %s runs the members but never logged taking their unit", in.name)
		}
	}

	// The owner stops: another instance takes the unit, all four members.
	var rest []*instance
	for _, in := range fleet {
		if in.name == owner {
			in.stop()
		} else {
			rest = append(rest, in)
		}
	}
	write(10)
	var moved string
	testenv.Eventually(t, 90*time.Second, "the unit moved whole to another instance", func() bool {
		moved = settled(rest)
		return moved != ""
	})
	if moved == owner {
		t.Fatalf("the members still run on %s, which stopped", owner)
	}
	write(10)
	e.Coll.WaitFor(t, 90*time.Second, "every event", func(m []testenv.Received) bool {
		got := map[string]int{}
		for _, d := range relaytest.Decode(t, m) {
			got[d.Aggregate] = max(got[d.Aggregate], d.Seq)
		}
		for table, n := range seq {
			if got[table] < n {
				return false
			}
		}
		return true
	})

	// Every event of every table once, in order.
	next := map[string]int{}
	for _, d := range relaytest.Decode(t, e.Coll.All()) {
		if d.Seq != next[d.Aggregate]+1 {
			t.Errorf("%s: event %d arrived after %d", d.Aggregate, d.Seq, next[d.Aggregate])
		}
		next[d.Aggregate] = max(next[d.Aggregate], d.Seq)
	}
	for table, n := range seq {
		if next[table] != n {
			t.Errorf("%s: %d of %d events arrived", table, next[table], n)
		}
	}
}
