package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// An expiring token matches until its expiry and then only as "expired";
// MatchToken, which callers already use, does not match it at all.
func TestTokenExpiry(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), nil)
	tok, secret, err := s.CreateTokenWith(ctx, admin, "tenant:team-a", store.TokenOptions{Description: "ci", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if tok.ExpiresAt == nil || tok.ExpiresAt.Sub(tok.CreatedAt) != time.Hour || tok.Description != "ci" {
		t.Fatalf("token %+v, want an expiry an hour after creation", tok)
	}
	forever, foreverSecret, err := s.CreateToken(ctx, admin, store.ScopeRead, "")
	if err != nil || forever.ExpiresAt != nil {
		t.Fatalf("a token without a TTL: %+v %v", forever, err)
	}
	toks, err := s.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := tok.CreatedAt.Add(time.Minute)
	if got, m := store.MatchTokenAt(toks, secret, now); m != store.TokenValid || got.ID != tok.ID {
		t.Fatalf("before expiry: %v %+v", m, got)
	}
	if got, m := store.MatchTokenAt(toks, secret, tok.ExpiresAt.Add(-time.Nanosecond)); m != store.TokenValid || got.ID != tok.ID {
		t.Fatalf("just before expiry: %v", m)
	}
	if got, m := store.MatchTokenAt(toks, secret, *tok.ExpiresAt); m != store.TokenExpired || got.ID != tok.ID {
		t.Fatalf("at expiry: %v %+v, want expired with the token's id", m, got)
	}
	if _, m := store.MatchTokenAt(toks, foreverSecret, now.Add(100*365*24*time.Hour)); m != store.TokenValid {
		t.Fatalf("a token without expiry, in a century: %v", m)
	}
	if _, m := store.MatchTokenAt(toks, "ferry_"+strings.Repeat("0", 64), now); m != store.TokenUnknown {
		t.Fatalf("an unknown secret: %v", m)
	}

	// Expired on the database's clock: MatchToken refuses it.
	if got, ok := store.MatchToken(toks, secret); !ok || got.ID != tok.ID {
		t.Fatalf("MatchToken before expiry: %v", ok)
	}
	if _, err := conn.Exec(ctx, `UPDATE ferry_tokens SET expires_at = now() - interval '1 second' WHERE id = $1`, tok.ID); err != nil {
		t.Fatal(err)
	}
	if toks, err = s.Tokens(ctx); err != nil {
		t.Fatal(err)
	}
	if got, ok := store.MatchToken(toks, secret); ok {
		t.Fatalf("MatchToken matched an expired token: %+v", got)
	}
	if _, m := store.MatchTokenAt(toks, secret, time.Now()); m != store.TokenExpired {
		t.Fatalf("MatchTokenAt: %v, want expired", m)
	}

	var ve *store.ValidationError
	if _, _, err := s.CreateTokenWith(ctx, admin, store.ScopeRead, store.TokenOptions{TTL: -time.Second}); !errors.As(err, &ve) || ve.Problems[0].Path != "ttl" {
		t.Fatalf("a negative TTL: %v", err)
	}
	creates := auditOf(t, s, store.ActionTokenCreate)
	if len(creates) != 2 || !strings.Contains(creates[1].Detail, " expires "+tok.ExpiresAt.UTC().Format(time.RFC3339)) {
		t.Fatalf("token_create audit: %+v", creates)
	}
}

func lastUsed(t *testing.T, s *store.Store, id string) *time.Time {
	t.Helper()
	toks, err := s.Tokens(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if tok.ID == id {
			return tok.LastUsedAt
		}
	}
	t.Fatalf("no token %s", id)
	return nil
}

// last_used_at is written on first use, then at most once a minute.
func TestTouchTokenThrottled(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), nil)
	tok, _, err := s.CreateToken(ctx, admin, store.ScopeRead, "")
	if err != nil {
		t.Fatal(err)
	}
	if lu := lastUsed(t, s, tok.ID); lu != nil {
		t.Fatalf("a new token was used at %v", lu)
	}
	if err := s.TouchToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	first := lastUsed(t, s, tok.ID)
	if first == nil {
		t.Fatal("first use not recorded")
	}
	for range 5 {
		if err := s.TouchToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
	}
	if again := lastUsed(t, s, tok.ID); !again.Equal(*first) {
		t.Fatalf("a use within the minute rewrote last_used_at: %v, then %v", first, again)
	}
	var xmin1, xmin2 string
	if err := conn.QueryRow(ctx, `SELECT xmin::text FROM ferry_tokens WHERE id = $1`, tok.ID).Scan(&xmin1); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT xmin::text FROM ferry_tokens WHERE id = $1`, tok.ID).Scan(&xmin2); err != nil || xmin1 != xmin2 {
		t.Fatalf("the throttled touch wrote the row (xmin %s -> %s, %v)", xmin1, xmin2, err)
	}
	// A minute later (moved back rather than waited for), it is written again.
	if _, err := conn.Exec(ctx, `UPDATE ferry_tokens SET last_used_at = now() - interval '61 seconds' WHERE id = $1`, tok.ID); err != nil {
		t.Fatal(err)
	}
	aged := lastUsed(t, s, tok.ID)
	if err := s.TouchToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if later := lastUsed(t, s, tok.ID); !later.After(*aged) {
		t.Fatalf("after a minute last_used_at stayed %v", later)
	}
	if err := s.TouchToken(ctx, "tok_missing"); err != nil {
		t.Fatalf("touching a deleted token: %v", err)
	}
}

// Rotation makes a token of the same scope, description and lifetime and
// lets the old one expire after the grace; it never extends the old one.
func TestRotateToken(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), nil)
	old, oldSecret, err := s.CreateTokenWith(ctx, admin, "tenant:team-a", store.TokenOptions{Description: "deploy bot", TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var before time.Time
	if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	fresh, freshSecret, err := s.RotateToken(ctx, admin, old.ID, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == old.ID || freshSecret == oldSecret || fresh.Scope != old.Scope || fresh.Description != "deploy bot" {
		t.Fatalf("rotated %+v from %+v", fresh, old)
	}
	if fresh.ExpiresAt == nil || fresh.ExpiresAt.Sub(fresh.CreatedAt) != 24*time.Hour {
		t.Fatalf("the new token's lifetime: %+v, want 24h like the old one", fresh)
	}
	toks, err := s.Tokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var oldNow store.Token
	for _, tk := range toks {
		if tk.ID == old.ID {
			oldNow = tk
		}
	}
	if oldNow.ExpiresAt == nil || oldNow.ExpiresAt.Before(before.Add(10*time.Minute)) || oldNow.ExpiresAt.After(before.Add(11*time.Minute)) {
		t.Fatalf("the old token expires %v, want about 10m after %v", oldNow.ExpiresAt, before)
	}
	if _, m := store.MatchTokenAt(toks, oldSecret, before.Add(9*time.Minute)); m != store.TokenValid {
		t.Fatalf("the old token within the grace: %v", m)
	}
	if _, m := store.MatchTokenAt(toks, oldSecret, before.Add(11*time.Minute)); m != store.TokenExpired {
		t.Fatalf("the old token after the grace: %v", m)
	}
	if got, m := store.MatchTokenAt(toks, freshSecret, before.Add(11*time.Minute)); m != store.TokenValid || got.ID != fresh.ID {
		t.Fatalf("the new token: %v", m)
	}
	// Rotating the old one again with a longer grace does not extend it.
	if _, _, err := s.RotateToken(ctx, admin, old.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	var again time.Time
	if err := conn.QueryRow(ctx, `SELECT expires_at FROM ferry_tokens WHERE id = $1`, old.ID).Scan(&again); err != nil || !again.Equal(*oldNow.ExpiresAt) {
		t.Fatalf("a second rotation moved the expiry from %v to %v (%v)", oldNow.ExpiresAt, again, err)
	}
	// Grace 0: the old token stops now; a token without expiry rotates into
	// one without expiry.
	forever, foreverSecret, err := s.CreateToken(ctx, admin, store.ScopeRead, "dash")
	if err != nil {
		t.Fatal(err)
	}
	next, _, err := s.RotateToken(ctx, admin, forever.ID, 0)
	if err != nil || next.ExpiresAt != nil {
		t.Fatalf("rotating a token without expiry: %+v %v", next, err)
	}
	if toks, err = s.Tokens(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := store.MatchToken(toks, foreverSecret); ok {
		t.Fatal("the old token still matches after a rotation without grace")
	}
	if _, _, err := s.RotateToken(ctx, admin, "tok_missing", 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rotating a missing token: %v", err)
	}
	var ve *store.ValidationError
	if _, _, err := s.RotateToken(ctx, admin, fresh.ID, -time.Second); !errors.As(err, &ve) {
		t.Fatalf("a negative grace: %v", err)
	}
	rot := auditOf(t, s, store.ActionTokenRotate)
	if len(rot) != 3 || !strings.Contains(rot[2].Detail, old.ID+" -> "+fresh.ID) || rot[2].Tenant != "team-a" {
		t.Fatalf("token_rotate audit: %+v", rot)
	}
}

// A flood of refused requests is one audit row a minute per caller,
// address, route and code, even from many goroutines at once.
func TestAuditDeniedAggregates(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), nil)
	flood := store.DeniedRequest{Address: "10.1.2.3", Route: "GET /api/v1/tokens", Code: 401, Reason: "unknown token"}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				d := flood
				if i%2 == 1 {
					d.Reason = "malformed Authorization header" // not part of the key
				}
				errs <- s.AuditDenied(ctx, d)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The flood may straddle a minute: then it is two rows, one per minute.
	rows, err := conn.Query(ctx, `SELECT date_trunc('minute', at AT TIME ZONE 'UTC')::text, count(*), sum(count)
		FROM ferry_audit WHERE action = 'denied' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	type minute struct {
		at        string
		rows, sum int
	}
	perMinute, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (minute, error) {
		var m minute
		return m, r.Scan(&m.at, &m.rows, &m.sum)
	})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, m := range perMinute {
		if m.rows != 1 {
			t.Fatalf("minute %s has %d denied rows for one caller, address, route and code", m.at, m.rows)
		}
		total += m.sum
	}
	if total != 200 || len(perMinute) > 2 {
		t.Fatalf("200 denials recorded as %+v", perMinute)
	}

	// Any other caller, address, route or code is a row of its own.
	for _, d := range []store.DeniedRequest{
		{TokenID: "tok_b", Scope: "tenant:team-b", Address: "10.1.2.3", Route: "GET /api/v1/tokens", Code: 403, Reason: "scope tenant:team-b may not list tokens"},
		{Address: "10.9.9.9", Route: "GET /api/v1/tokens", Code: 401, Reason: "unknown token"},
		{Address: "10.1.2.3", Route: "GET /api/v1/audit", Code: 401, Reason: "unknown token"},
		{Address: "10.1.2.3", Route: "GET /api/v1/tokens", Code: 429, Reason: "throttled"},
	} {
		if err := s.AuditDenied(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	es := auditOf(t, s, store.ActionDenied)
	if len(es) != len(perMinute)+4 {
		t.Fatalf("%d denied entries, want %d", len(es), len(perMinute)+4)
	}
	first := es[len(es)-1]
	if first.TokenID != "-" || first.Count < 100 || !strings.Contains(first.Detail, "401 GET /api/v1/tokens from 10.1.2.3: ") {
		t.Fatalf("the flood's entry: %+v", first)
	}
	if es[3].TokenID != "tok_b" || es[3].Tenant != "team-b" || es[3].Count != 1 || es[3].Scope != "tenant:team-b" {
		t.Fatalf("the 403's entry: %+v", es[3])
	}
	// A change still counts one.
	if _, _, err := s.CreateToken(ctx, admin, store.ScopeRead, ""); err != nil {
		t.Fatal(err)
	}
	if c := auditOf(t, s, store.ActionTokenCreate); len(c) != 1 || c[0].Count != 1 {
		t.Fatalf("a change's count: %+v", c)
	}
	// Untrusted text is bounded and storable.
	if err := s.AuditDenied(ctx, store.DeniedRequest{Address: "bad\x00addr", Route: "GET /x", Code: 401, Reason: strings.Repeat("\xff", 1000)}); err != nil {
		t.Fatalf("a reason that is not UTF-8: %v", err)
	}
}

// A tenant's limits and policy are set together by an admin, read back
// whole, and move the version only when one of them changes.
func TestTenantPolicy(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t, testenv.Postgres(t), nil)
	pol := policy.Policy{
		Databases:    []string{"db.internal:5432/orders", "db2:5432/*"},
		Brokers:      []string{"nats.internal:4222"},
		Destinations: []string{"orders."},
		AllowFiles:   true,
	}
	spec := store.TenantSpec{Limits: store.TenantLimits{MaxPipelines: 3, Rate: 100}, Policy: pol}
	tn, created, err := s.PutTenantSpec(ctx, admin, "team-a", spec, 0)
	if err != nil || !created || tn.Version != 1 || !reflect.DeepEqual(tn.Policy, pol) || tn.Limits != spec.Limits {
		t.Fatalf("create: %+v %v %v", tn, created, err)
	}
	got, err := s.Tenant(ctx, "team-a")
	if err != nil || !reflect.DeepEqual(got.Policy, pol) || got.Limits != spec.Limits {
		t.Fatalf("read back: %+v %v", got, err)
	}
	if ts, err := s.Tenants(ctx); err != nil || len(ts) != 1 || !reflect.DeepEqual(ts[0].Policy, pol) {
		t.Fatalf("list: %+v %v", ts, err)
	}
	// The same spec: no new version, no audit entry.
	if tn, created, err := s.PutTenantSpec(ctx, admin, "team-a", spec, 1); err != nil || created || tn.Version != 1 {
		t.Fatalf("unchanged: %+v %v %v", tn, created, err)
	}
	// The policy alone.
	spec.Policy.Brokers = append(spec.Policy.Brokers, "kafka-1:9092")
	if tn, _, err := s.PutTenantSpec(ctx, admin, "team-a", spec, 1); err != nil || tn.Version != 2 || len(tn.Policy.Brokers) != 2 {
		t.Fatalf("policy change: %+v %v", tn, err)
	}
	// The limits alone, through PutTenant: the policy stays.
	if tn, _, err := s.PutTenant(ctx, admin, "team-a", store.TenantLimits{MaxPipelines: 5}, 0); err != nil || tn.Version != 3 || len(tn.Policy.Brokers) != 2 || !tn.Policy.AllowFiles {
		t.Fatalf("limits change through PutTenant: %+v %v", tn, err)
	}
	if _, _, err := s.PutTenantSpec(ctx, admin, "team-a", spec, 2); !errors.As(err, new(*store.VersionMismatchError)) {
		t.Fatalf("a stale If-Match: %v", err)
	}
	es := auditOf(t, s, store.ActionTenantPut)
	if len(es) != 3 {
		t.Fatalf("%d tenant_put entries, want 3: %+v", len(es), es)
	}
	if d := es[0].Detail; !strings.Contains(d, "limits ") || strings.Contains(d, "policy ") {
		t.Fatalf("the limits change says %q", d)
	}
	if d := es[1].Detail; strings.Contains(d, "limits ") || !strings.Contains(d, `policy {`) || !strings.Contains(d, "kafka-1:9092") {
		t.Fatalf("the policy change says %q", d)
	}
	if es[1].OldVersion == nil || *es[1].OldVersion != 1 || *es[1].NewVersion != 2 || es[2].OldVersion != nil {
		t.Fatalf("versions in the audit: %+v", es)
	}

	// A tenant created by its first pipeline has the empty policy.
	if _, err := s.PutPipeline(ctx, admin, store.Write{Name: "p", Tenant: "team-b", Config: "x", Canonical: "x"}); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Tenant(ctx, "team-b"); err != nil || !reflect.DeepEqual(b.Policy, policy.Policy{}) {
		t.Fatalf("an implicit tenant's policy: %+v %v", b.Policy, err)
	}
	// Clearing the policy is a change; clearing it again is not.
	if tn, _, err := s.PutTenantSpec(ctx, admin, "team-a", store.TenantSpec{Limits: store.TenantLimits{MaxPipelines: 5}}, 0); err != nil || tn.Version != 4 || len(tn.Policy.Databases) != 0 {
		t.Fatalf("clear: %+v %v", tn, err)
	}
	if tn, _, err := s.PutTenantSpec(ctx, admin, "team-a", store.TenantSpec{Limits: store.TenantLimits{MaxPipelines: 5}, Policy: policy.Policy{Databases: []string{}}}, 0); err != nil || tn.Version != 4 {
		t.Fatalf("an empty list after none: %+v %v", tn, err)
	}

	// Refusals: a bad policy or limit (by path), a bad name, a non-admin.
	bad := store.TenantSpec{Limits: store.TenantLimits{Rate: -1}, Policy: policy.Policy{Databases: []string{"db:5432/orders", "nohost"}, Brokers: []string{"kafka"}}}
	_, _, err = s.PutTenantSpec(ctx, admin, "team-a", bad, 0)
	var ve *store.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("a bad spec: %v", err)
	}
	var paths []string
	for _, p := range ve.Problems {
		paths = append(paths, p.Path)
	}
	if fmt.Sprint(paths) != "[limits.rate policy.databases[1] policy.brokers[0]]" {
		t.Fatalf("problems at %v", paths)
	}
	if _, _, err := s.PutTenantSpec(ctx, admin, "Team A", store.TenantSpec{}, 0); !errors.As(err, &ve) || ve.Problems[0].Path != "name" {
		t.Fatalf("a bad name: %v", err)
	}
	for _, sc := range []store.Scope{"tenant:team-a", "read", "read:team-a"} {
		if _, _, err := s.PutTenantSpec(ctx, store.Actor{TokenID: "t", Scope: sc}, "team-a", store.TenantSpec{}, 0); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("%s sets a tenant spec: %v", sc, err)
		}
	}
	if got, _ := s.Tenant(ctx, "team-a"); got.Version != 4 {
		t.Fatalf("a refused write changed the tenant: %+v", got)
	}
}

// The store refuses, on the locked row, a pipeline written into a tenant
// the actor's scope cannot write: on create, and on an update that moves
// it (to another tenant or to none).
func TestPutPipelineNewTenantChecked(t *testing.T) {
	ctx := context.Background()
	s, _ := openStore(t, testenv.Postgres(t), nil)
	teamB := store.Actor{TokenID: "tok_b", Scope: "tenant:team-b"}
	w := func(name, tenant, config string) store.Write {
		return store.Write{Name: name, Tenant: tenant, Config: config, Canonical: config}
	}
	for _, tenant := range []string{"team-a", ""} {
		if _, err := s.PutPipeline(ctx, teamB, w("p-"+tenant, tenant, "v1")); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("team-b creates a pipeline in tenant %q: %v", tenant, err)
		}
	}
	if _, err := s.PutPipeline(ctx, store.Actor{TokenID: "r", Scope: "read:team-b"}, w("p", "team-b", "v1")); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("a reader creates a pipeline: %v", err)
	}
	if ps, err := s.Pipelines(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("refused creates left %+v (%v)", ps, err)
	}
	if _, err := s.PutPipeline(ctx, teamB, w("orders", "team-b", "v1")); err != nil {
		t.Fatalf("team-b creates its own: %v", err)
	}
	for _, tenant := range []string{"team-a", ""} {
		if _, err := s.PutPipeline(ctx, teamB, w("orders", tenant, "v2")); !errors.Is(err, store.ErrForbidden) {
			t.Fatalf("team-b moves its pipeline to tenant %q: %v", tenant, err)
		}
	}
	p, err := s.Pipeline(ctx, "orders")
	if err != nil || p.Tenant != "team-b" || p.Version != 1 || p.Config != "v1" {
		t.Fatalf("after refused moves: %+v %v", p, err)
	}
	if _, err := s.PutPipeline(ctx, teamB, w("orders", "team-b", "v2")); err != nil {
		t.Fatalf("team-b updates its own: %v", err)
	}
	if res, err := s.PutPipeline(ctx, admin, w("orders", "team-a", "v2")); err != nil || res.Pipeline.Tenant != "team-a" {
		t.Fatalf("the admin moves it: %+v %v", res, err)
	}
	if _, err := s.PutPipeline(ctx, teamB, w("orders", "team-b", "v3")); !errors.Is(err, store.ErrForbidden) {
		t.Fatalf("team-b takes team-a's pipeline: %v", err)
	}
}

// A store written by the previous release (steps 1 and 2) upgrades in
// place: its tenants get the empty (deny-all) policy, its tokens no expiry,
// its audit entries a count of one.
func TestMigrationFromStep2(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE ferry_store_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, m := range store.Migrations[:2] {
		if _, err := conn.Exec(ctx, m.SQL); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO ferry_store_migrations (version) VALUES ($1)`, m.Version); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO ferry_tenants (name, limits) VALUES ('team-a', '{"rate": 5}');
		INSERT INTO ferry_tokens (id, scope, sha256) VALUES ('tok_old', 'admin', '\x00');
		INSERT INTO ferry_audit (token_id, scope, action) VALUES ('x', 'admin', 'create')`); err != nil {
		t.Fatal(err)
	}
	s, _ := openStore(t, dsn, nil)
	tn, err := s.Tenant(ctx, "team-a")
	if err != nil || tn.Limits.Rate != 5 || !reflect.DeepEqual(tn.Policy, policy.Policy{}) {
		t.Fatalf("upgraded tenant: %+v %v", tn, err)
	}
	toks, err := s.Tokens(ctx)
	if err != nil || len(toks) != 1 || toks[0].ExpiresAt != nil || toks[0].LastUsedAt != nil {
		t.Fatalf("upgraded tokens: %+v %v", toks, err)
	}
	es, err := s.Audit(ctx, store.AuditFilter{})
	if err != nil || len(es) != 1 || es[0].Count != 1 {
		t.Fatalf("upgraded audit: %+v %v", es, err)
	}
}
