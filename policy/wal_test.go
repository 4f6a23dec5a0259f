package policy_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/wal"
)

// loadWal reads one wal pipeline as the store's converger would.
func loadWal(t *testing.T, name, tenant, source string) *pipelines.Spec {
	t.Helper()
	r := plugins.NewRegistry()
	wal.Register(r)
	nats.Register(r)
	specs, err := pipelines.Loader{Registry: r, LookupEnv: func(string) (string, bool) { return "", false }}.
		LoadBytes("store:"+name, []byte(pipeline(name, tenant, source, "", "", "")))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return specs[0]
}

// TestCheckReplicationObjects: two tenants' wal pipelines on one database
// they may share never name, share, derive or take each other's slots and
// publications.
func TestCheckReplicationObjects(t *testing.T) {
	const dsn = `dsn: "postgres://u@db.internal:5432/orders"`
	src := func(more string) string { return "{type: wal, " + dsn + more + "}" }
	teamAShared := loadWal(t, "a-orders", "team-a", src(""))
	teamAOwn := loadWal(t, "orders-outbox", "team-a", src(", slot_mode: own"))
	teamANamed := loadWal(t, "a-named", "team-a", src(", slot: ferry_team_a_orders, publication: ferry_team_a_orders"))
	teamAOther := loadWal(t, "a-other", "team-a", `{type: wal, dsn: "postgres://u@db.internal:5432/billing", slot: ferry_team_a_billing, publication: ferry_team_a_billing}`)
	admin := loadWal(t, "admin-orders", "", src(", slot: ferry_admin"))
	pol := with(allowed, func(p *policy.Policy) { p.SharedDatabases = true })
	for _, c := range []struct {
		name   string
		source string // team-b's
		pname  string
		others []*pipelines.Spec
		want   []string
	}{
		{name: "alone, the default shared slot", source: src("")},
		{name: "own names under its prefix", source: src(", slot: ferry_team_b_orders, publication: ferry_team_b_orders"),
			others: []*pipelines.Spec{teamAShared, teamAOwn, teamANamed}},
		{name: "a name outside its prefix", source: src(", slot: ferry_team_a_orders, drop_slot_on_stop: true"), want: []string{
			`source.slot: "ferry_team_a_orders" is not under tenant team-b's prefix ferry_team_b_`}},
		{name: "a publication outside its prefix", source: src(", slot: ferry_team_b_x, publication: ferry_shared_orders, slot_mode: shared"),
			want: []string{`source.publication: "ferry_shared_orders" is not under tenant team-b's prefix ferry_team_b_`}},
		{name: "another tenant's named slot", source: src(", slot: ferry_team_a_orders"), others: []*pipelines.Spec{teamANamed}, want: []string{
			`source.slot: "ferry_team_a_orders" is not under tenant team-b's prefix`,
			"source.slot: replication slot ferry_team_a_orders on db.internal:5432 is used by a pipeline of another tenant",
		}},
		{name: "the default shared slot another tenant streams", source: src(""), others: []*pipelines.Spec{teamAShared}, want: []string{
			"source.slot: replication slot ferry_shared_orders on db.internal:5432 is used by a pipeline of another tenant",
			"source.publication: publication ferry_shared_orders on db.internal:5432 is used by a pipeline of another tenant",
		}},
		{name: "the default shared slot named by another tenant's prefix", source: src(", slot_mode: shared"),
			others: []*pipelines.Spec{teamANamed, teamAOther}},
		// orders_outbox derives ferry_orders_outbox, team-a's own slot:
		// its drop_slot_on_stop, a reset or a purge would take it.
		{name: "a pipeline name that derives another's own slot", pname: "orders_outbox", source: src(", slot_mode: own, drop_slot_on_stop: true"),
			others: []*pipelines.Spec{teamAOwn}, want: []string{
				"source.slot: replication slot ferry_orders_outbox on db.internal:5432 is used by a pipeline of another tenant",
				"source.publication: publication ferry_orders_outbox on db.internal:5432 is used by a pipeline of another tenant",
			}},
		// The initial snapshot's temporary slot is <slot>_init: taken,
		// team-a's first start could not create it.
		{name: "a pipeline name that derives another's snapshot slot", pname: "orders_outbox_init", source: src(", slot_mode: own"),
			others: []*pipelines.Spec{teamAOwn}, want: []string{
				"source.slot: replication slot ferry_orders_outbox_init on db.internal:5432 is used by a pipeline of another tenant",
			}},
		// A shared member moves off (or is split onto) ferry_<pipeline>:
		// it would drain and drop team-a's own slot.
		{name: "a shared member whose own slot is another's", pname: "orders_outbox", source: src(", slot: ferry_team_b_s, publication: ferry_team_b_s, slot_mode: shared"),
			others: []*pipelines.Spec{teamAOwn}, want: []string{
				"source.slot: replication slot ferry_orders_outbox on db.internal:5432 is used by a pipeline of another tenant",
				"source.publication: publication ferry_orders_outbox",
			}},
		{name: "the admin's slot", source: src(", slot: ferry_admin"), others: []*pipelines.Spec{admin}, want: []string{
			`source.slot: "ferry_admin" is not under tenant team-b's prefix`,
			"source.slot: replication slot ferry_admin on db.internal:5432 is used by a pipeline of another tenant",
		}},
		{name: "another server", source: `{type: wal, dsn: "postgres://u@db2.internal:5432/orders"}`, others: []*pipelines.Spec{teamAShared}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := c.pname
			if name == "" {
				name = "b-orders"
			}
			p := pol
			p.Databases = append(p.Databases, "db2.internal:5432/orders")
			spec := loadWal(t, name, "team-b", c.source)
			got := problems(policy.Check(spec, p, policy.CheckEnv{Others: c.others}))
			if len(got) != len(c.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(c.want), strings.Join(got, "\n"))
			}
			for i, w := range c.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("problem %d:\n got %s\nwant %s…", i, got[i], w)
				}
				for _, leak := range []string{"team-a", "a-orders", "orders-outbox", "a-named"} {
					if strings.Contains(got[i], leak) {
						t.Errorf("problem %d names another tenant's %q: %s", i, leak, got[i])
					}
				}
			}
		})
	}
}
