package policy

import (
	"sort"
	"strings"

	"github.com/ferryhq/ferry/pipelines"
)

// Replication objects: what a source keeps by name on its database server
// (the wal source's replication slots and publications). A slot name is
// the server's, not a database's, and whoever names a slot may stream,
// advance and drop it (drop_slot_on_stop, a reset, a purge, a move to a
// shared slot); a publication is changed by a shared stream's member
// (ALTER PUBLICATION … ADD TABLE). So a tenant's pipeline names only its
// own: what its YAML sets must start with the tenant's prefix, and no name
// it would use — set or derived from its pipeline name or its database —
// may be one a pipeline of another tenant (or the admin's) on the same
// server uses. Two tenants therefore never share a slot: on a database
// another tenant's wal pipelines stream through the default shared slot,
// a newcomer names a shared slot of its own.

// replicationNamer is implemented by source configs that keep replication
// objects on their server (the wal source's Config).
type replicationNamer interface {
	// ReplicationObjects are the slot and publication names the pipeline
	// may create, stream, advance, alter or drop: the configured or default
	// ones, and those it derives (a shared member's own slot).
	ReplicationObjects(pipeline string) (slots, publications []string)
	// NamedReplicationObjects are the names the YAML sets, by key
	// ("slot", "publication").
	NamedReplicationObjects() map[string]string
}

// TenantPrefix is what the replication slot and publication names a
// tenant's pipeline sets must start with: "ferry_" and the tenant's name
// with "-" as "_", then "_" (team-b: "ferry_team_b_").
func TenantPrefix(tenant string) string {
	return "ferry_" + strings.ReplaceAll(tenant, "-", "_") + "_"
}

// replication checks the source's replication objects: named under the
// tenant's prefix, and none another tenant's pipeline uses on the same
// server.
func (c *checker) replication(comp pipelines.Component) {
	n, ok := comp.Config.(replicationNamer)
	if !ok {
		return
	}
	tenant, prefix := c.spec.Tenant, TenantPrefix(c.spec.Tenant)
	named := n.NamedReplicationObjects()
	keys := make([]string, 0, len(named))
	for k := range named {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if name := named[key]; name != "" && !strings.HasPrefix(name, prefix) {
			c.fail(join(comp.Path, key), "%q is not under tenant %s's prefix %s: a tenant's pipeline names only its own slots and "+
				"publications (leave it out for the default, or name one starting with %s)", name, tenant, prefix, prefix)
		}
	}
	slots, pubs := n.ReplicationObjects(c.spec.Name)
	takenSlot, takenPub := "", ""
	var where otherDatabase
	for _, here := range componentDatabases(comp.Config) {
		for _, o := range c.env.Others {
			if o == nil || o == c.spec || o.Tenant == tenant {
				continue
			}
			on, ok := o.Source.Config.(replicationNamer)
			if !ok {
				continue
			}
			oSlots, oPubs := on.ReplicationObjects(o.Name)
			for _, there := range componentDatabases(o.Source.Config) {
				if there.host != here.host || there.port != here.port {
					continue
				}
				if s := common(slots, oSlots); s != "" && takenSlot == "" {
					takenSlot, where = s, here
				}
				if p := common(pubs, oPubs); p != "" && there.database == here.database && takenPub == "" {
					takenPub, where = p, here
				}
			}
		}
	}
	for _, t := range []struct{ key, what, name string }{{"slot", "replication slot", takenSlot}, {"publication", "publication", takenPub}} {
		if t.name != "" {
			// Names the object and the server, never the other pipeline
			// or its tenant.
			c.fail(join(comp.Path, t.key), "%s %s on %s:%d is used by a pipeline of another tenant: a tenant's pipeline never shares, "+
				"streams, advances, alters or drops another's (set slot and publication to names of your own, e.g. %sshared, "+
				"with slot_mode: shared)", t.what, t.name, where.host, where.port, prefix)
		}
	}
}

// common is a name both lists hold, or "".
func common(a, b []string) string {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return x
			}
		}
	}
	return ""
}
