package doctor_test

import (
	"context"
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
	ctx := context.Background()
	role := testenv.Name("ferry_doctor")
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT SELECT, UPDATE ON public.outbox TO ` + role,
		`REVOKE SELECT ON public.outbox FROM ` + role,
	} {
		if _, err := e.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := e.Pool.Exec(context.Background(), q); err != nil {
				t.Logf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	e.DSN = u.String()

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
