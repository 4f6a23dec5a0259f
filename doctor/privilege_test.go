package doctor_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
)

// A poll pipeline's role that may update the outbox but no longer read
// it: the doctor names the permission error as one — the privilege
// missing and the GRANT that gives it — where it said the table lacked a
// column and to check the database was reachable.
func TestPermissionDeniedNamesTheGrant(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema, Extra: "poll_interval: 20ms"})
	role := loginRole(t, e,
		`GRANT SELECT, UPDATE ON public.outbox TO %s`,
		`REVOKE SELECT ON public.outbox FROM %s`)

	d := diagnose(t, load(t, e.YAML("denied", 100)), opts, doctor.StageSource, 1)
	src := d.Checks[len(d.Checks)-1]
	ev := strings.Join(src.Evidence, " ")
	if !strings.Contains(ev, "lacks SELECT on public.outbox") || !strings.Contains(ev, "42501") {
		t.Errorf("evidence does not name the missing privilege: %q", ev)
	}
	if want := "GRANT SELECT ON public.outbox TO " + role; !strings.Contains(src.Action, want) {
		t.Errorf("action %q, want it to say %q", src.Action, want)
	}
	for _, c := range d.Checks {
		all := strings.Join(append(c.Evidence, c.Action), " ")
		if strings.Contains(all, "lacks a column") || strings.Contains(all, "reachable") {
			t.Errorf("%s check still blames a column or reachability: %q", c.Stage, all)
		}
	}
}

// loginRole creates a login role, runs grants (%s its name) and points
// e.DSN at it; the role is dropped when the test ends.
func loginRole(t *testing.T, e *relaytest.Env, grants ...string) string {
	t.Helper()
	ctx := context.Background()
	role := testenv.Name("ferry_doctor")
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := e.Pool.Exec(context.Background(), q); err != nil {
				t.Logf("%s: %v", q, err)
			}
		}
	})
	for _, g := range append([]string{`CREATE ROLE %s LOGIN`}, grants...) {
		q := fmt.Sprintf(g, role)
		if _, err := e.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	e.DSN = u.String()
	return role
}

// The outbox in a schema the role may not use: the doctor names the
// schema's USAGE, not the table's privileges the role has.
func TestPermissionDeniedOnSchema(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema, Extra: "poll_interval: 20ms"})
	ddl, err := poll.Schema("app.outbox")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pool.Exec(context.Background(), "CREATE SCHEMA app; "+ddl); err != nil {
		t.Fatal(err)
	}
	role := loginRole(t, e, `GRANT SELECT, UPDATE ON app.outbox TO %s`)
	e.Table = "app.outbox"
	d := diagnose(t, load(t, e.YAML("noschema", 100)), opts, doctor.StageSource, 1)
	src := d.Checks[len(d.Checks)-1]
	if ev := strings.Join(src.Evidence, " "); !strings.Contains(ev, "lacks USAGE on schema app:") {
		t.Errorf("evidence does not name the schema's USAGE: %q", ev)
	}
	if want := "GRANT USAGE ON SCHEMA app TO " + role + ";"; !strings.Contains(src.Action, want) || strings.Contains(src.Action, "ON app.outbox") {
		t.Errorf("action %q, want only %q", src.Action, want)
	}
}

// The preflight (validate --connect, the API's ?connect=true) finds a
// privilege the role lacks before the first use of it fails: a poll
// role that may read the outbox but not mark it is named with the GRANT,
// and with both the source is ok.
func TestPreflightNamesAMissingGrant(t *testing.T) {
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: poll.Name, Schema: poll.Schema, Extra: "poll_interval: 20ms"})
	role := loginRole(t, e, `GRANT SELECT ON public.outbox TO %s`)
	d := doctor.Preflight(context.Background(), load(t, e.YAML("readonly", 100))[0], opts)
	src := d.Checks[0]
	if d.Healthy || d.Stage != doctor.StageSource || !strings.Contains(strings.Join(src.Evidence, " "), "lacks UPDATE on public.outbox") ||
		!strings.Contains(src.Action, "GRANT UPDATE ON public.outbox TO "+role) {
		t.Fatalf("preflight of a read-only poll role: %+v", d)
	}
	if _, err := e.Pool.Exec(context.Background(), fmt.Sprintf(`GRANT UPDATE ON public.outbox TO %s`, role)); err != nil {
		t.Fatal(err)
	}
	if d := doctor.Preflight(context.Background(), load(t, e.YAML("readonly", 100))[0], opts); !d.Healthy {
		t.Fatalf("preflight with SELECT and UPDATE: %+v", d)
	}
}
