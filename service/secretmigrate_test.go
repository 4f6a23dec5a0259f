package service_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/service"
	natssink "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/store"
)

// The literals of literalOrders; the hosts refuse connections at once, so
// the pipeline a convergence starts fails fast and quietly.
const (
	dbPassword   = "s3cr3t%40Pa55"
	natsPassword = "n4ts-Pa55word"
	literalDSN   = "postgres://orders:" + dbPassword + "@127.0.0.1:1/orders"
)

// literalOrders is team-a's pipeline as a store written before literal
// passwords were refused holds it.
const literalOrders = `# team-a's orders
name: orders
tenant: team-a
source:
  type: xid8
  dsn: ` + literalDSN + ` # primary
  table: public.outbox
sink:
  type: nats
  url: nats://127.0.0.1:1
  subject: orders.events
  user: relay
  password: ` + natsPassword + `
`

// putRaw stores a pipeline text as an old store would have: the store
// runs no loader on writes.
func putRaw(t *testing.T, s *store.Store, name, tenant, text string) {
	t.Helper()
	_, sum, err := store.Canonical([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutPipeline(context.Background(), admin, store.Write{Name: name, Tenant: tenant, Config: text, Canonical: sum}); err != nil {
		t.Fatal(err)
	}
}

// lockedBuffer is a log sink safe for the converger's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newConverger is a converger on s with a supervisor of its own, logging
// to the buffer returned; the pipelines it starts stop with the test.
func newConverger(t *testing.T, s *store.Store) (*service.Converger, *lockedBuffer) {
	t.Helper()
	sup, err := engine.NewSupervisor(engine.Options{Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, st := range sup.Statuses() {
			_ = sup.Stop(st.Name)
		}
	})
	logs := &lockedBuffer{}
	return &service.Converger{Store: s, Supervisor: sup, Logger: slog.New(slog.NewTextHandler(logs, nil))}, logs
}

// configHolds counts the pipelines whose stored text contains needle.
func configHolds(t *testing.T, conn *pgx.Conn, needle string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM ferry_pipelines WHERE position($1 IN config) > 0`, needle).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A tenant pipeline stored with literal passwords is migrated when an
// instance with a key starts: the text holds references, the secrets the
// literals, no table the literals; the audit row names the secrets; the
// pipeline loads and resolves to what it said before. A secret of the
// same name another pipeline uses is left alone; an admin's pipeline is
// not touched; a second start changes nothing.
func TestMigrateLiteralSecretsAtStart(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	putRaw(t, s, "orders", "team-a", literalOrders)
	// What an admin allows team-a, so the migrated pipeline runs.
	if _, _, err := s.PutTenantSpec(ctx, admin, "team-a", store.TenantSpec{Policy: policy.Policy{Databases: []string{"127.0.0.1:1/orders"},
		Brokers: []string{"127.0.0.1:1"}, Destinations: []string{"orders."}}}, 0); err != nil {
		t.Fatal(err)
	}
	adminText := strings.NewReplacer("tenant: team-a\n", "", "name: orders", "name: admins", dbPassword, "adm1n-Pa55", natsPassword, "adm1n-N4ts").Replace(literalOrders)
	putRaw(t, s, "admins", "", adminText)
	if _, err := s.PutSecret(ctx, admin, "team-a", "FERRY_ORDERS_SINK_PASSWORD", []byte("another pipeline's")); err != nil {
		t.Fatal(err)
	}

	conv, logs := newConverger(t, s)
	if err := conv.Start(ctx); err != nil {
		t.Fatal(err)
	}

	p, err := s.Pipeline(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# team-a's orders\n",
		"  dsn: postgres://orders:${FERRY_ORDERS_SOURCE_DSN}@127.0.0.1:1/orders # primary\n",
		"  password: ${FERRY_ORDERS_SINK_PASSWORD_2}\n",
	} {
		if !strings.Contains(p.Config, want) {
			t.Errorf("the migrated text lacks %q:\n%s", want, p.Config)
		}
	}
	if _, sum, _ := store.Canonical([]byte(p.Config)); p.Version != 2 || p.UpdatedBy != "migration" || p.ConfigSHA256 != sum {
		t.Errorf("migrated row: version %d, updated by %q, hash %s (canonical %s)", p.Version, p.UpdatedBy, p.ConfigSHA256, sum)
	}

	secrets, err := s.TenantSecrets(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if secrets["FERRY_ORDERS_SOURCE_DSN"] != dbPassword || secrets["FERRY_ORDERS_SINK_PASSWORD_2"] != natsPassword ||
		secrets["FERRY_ORDERS_SINK_PASSWORD"] != "another pipeline's" || len(secrets) != 3 {
		t.Errorf("team-a's secrets: %d of them, wrong values", len(secrets))
	}
	infos, err := s.Secrets(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range infos {
		wantBy := "migration"
		if i.Name == "FERRY_ORDERS_SINK_PASSWORD" {
			wantBy = admin.String()
		}
		if i.Version != 1 || i.UpdatedBy != wantBy {
			t.Errorf("secret %s: version %d updated by %q, want 1 by %q", i.Name, i.Version, i.UpdatedBy, wantBy)
		}
	}

	for _, literal := range []string{dbPassword, "s3cr3t@Pa55", natsPassword} {
		if n := configHolds(t, conn, literal); n != 0 {
			t.Errorf("%d stored configs still hold a literal", n)
		}
		for _, table := range []string{"ferry_pipelines", "ferry_audit", "ferry_secrets"} {
			if n := tableHolds(t, conn, table, []byte(literal)); n != 0 {
				t.Errorf("%s: %d rows hold a literal", table, n)
			}
		}
		if strings.Contains(logs.String(), literal) {
			t.Errorf("the log holds a literal:\n%s", logs)
		}
	}
	if n := configHolds(t, conn, "adm1n-Pa55"); n != 1 {
		t.Errorf("the admin's pipeline was rewritten (%d rows hold its literal)", n)
	}
	if a, err := s.Pipeline(ctx, "admins"); err != nil || a.Version != 1 || a.Config != adminText {
		t.Errorf("the admin's pipeline: version %d, err %v", a.Version, err)
	}

	entries := auditOf(t, s, store.ActionMigrateSecret)
	if len(entries) != 1 {
		t.Fatalf("%d migrate_secret entries, want 1", len(entries))
	}
	e := entries[0]
	if e.Pipeline != "orders" || e.Tenant != "team-a" || e.TokenID != "migration" || e.OldVersion == nil || *e.OldVersion != 1 ||
		e.NewVersion == nil || *e.NewVersion != 2 || !strings.Contains(e.Detail, "orders") ||
		!strings.Contains(e.Detail, "team-a/FERRY_ORDERS_SOURCE_DSN") || !strings.Contains(e.Detail, "team-a/FERRY_ORDERS_SINK_PASSWORD_2") {
		t.Errorf("migrate_secret entry %+v", e)
	}
	if line := logLine(logs.String(), "moved the literal passwords"); !strings.Contains(line, "pipeline=orders") || !strings.Contains(line, "tenant=team-a") {
		t.Errorf("no log line for the migration:\n%s", logs)
	}

	// It runs on this instance: the convergence after the migration loaded
	// it in control-plane mode, with the moved secrets.
	if prob, ok := conv.Snapshot().Problems["orders"]; ok {
		t.Fatalf("the migrated pipeline does not load: %s", prob)
	}
	loaded, err := conv.TenantLoader().LoadBytes("store:orders", []byte(p.Config))
	if err != nil {
		t.Fatal(err)
	}
	if dsn := loaded[0].Source.Config.(*xid8.Config).DSN; dsn != literalDSN {
		t.Errorf("the migrated dsn resolves to another text")
	}
	if pw := loaded[0].Sink.Config.(*natssink.Config).Password; pw != natsPassword {
		t.Errorf("the migrated nats password resolves to another text")
	}

	// Again, as after a restart: nothing to do.
	before := snapshotSecrets(t, conn)
	again, _ := newConverger(t, s)
	if err := again.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if p2, _ := s.Pipeline(ctx, "orders"); p2.Version != 2 || p2.Config != p.Config {
		t.Errorf("a second start rewrote the pipeline: version %d", p2.Version)
	}
	if n := len(auditOf(t, s, store.ActionMigrateSecret)); n != 1 {
		t.Errorf("%d migrate_secret entries after a second start", n)
	}
	if after := snapshotSecrets(t, conn); after != before {
		t.Error("a second start rewrote secrets")
	}
}

// A migration never overwrites a secret that holds another value, even
// when its view of the tenant's secrets is stale (here: blind), and it is
// all or nothing: no secret and no new version are left behind.
func TestMigrateLiteralSecretsKeepsHeldSecrets(t *testing.T) {
	ctx := context.Background()
	s, conn := openStore(t, testenv.Postgres(t), ring(t, 1))
	putRaw(t, s, "orders", "team-a", literalOrders)
	if _, err := s.PutSecret(ctx, admin, "team-a", "FERRY_ORDERS_SINK_PASSWORD", []byte("another pipeline's")); err != nil {
		t.Fatal(err)
	}
	before := snapshotSecrets(t, conn)
	conv, logs := newConverger(t, s)
	conv.Loader = pipelines.Loader{TenantSecrets: func(string, string) (string, bool) { return "", false }}
	if err := conv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Pipeline(ctx, "orders"); p.Version != 1 || p.Config != literalOrders {
		t.Errorf("the pipeline changed: version %d", p.Version)
	}
	if after := snapshotSecrets(t, conn); after != before {
		t.Errorf("the secrets changed:\n%s\nwas\n%s", after, before)
	}
	if n := len(auditOf(t, s, store.ActionMigrateSecret)); n != 0 {
		t.Errorf("%d migrate_secret entries", n)
	}
	warn := logLine(logs.String(), "level=WARN")
	if !strings.Contains(warn, "team-a/FERRY_ORDERS_SINK_PASSWORD already holds another value") || strings.Contains(warn, natsPassword) {
		t.Errorf("the warning: %s", warn)
	}
}

// Without a key nothing is migrated, the start goes on, one warning names
// the pipeline and says what to configure, and the loader refuses the
// pipeline; an instance started later with a key migrates it.
func TestMigrateLiteralSecretsWithoutKey(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	keyless, conn := openStore(t, dsn, nil)
	putRaw(t, keyless, "orders", "team-a", literalOrders)

	conv, logs := newConverger(t, keyless)
	if err := conv.Start(ctx); err != nil {
		t.Fatalf("start without a key: %v", err)
	}
	p, err := keyless.Pipeline(ctx, "orders")
	if err != nil || p.Version != 1 || p.Config != literalOrders {
		t.Fatalf("without a key the pipeline changed: version %d, err %v", p.Version, err)
	}
	var secrets int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM ferry_secrets`).Scan(&secrets); err != nil || secrets != 0 {
		t.Fatalf("%d secrets written without a key (%v)", secrets, err)
	}
	if n := len(auditOf(t, keyless, store.ActionMigrateSecret)); n != 0 {
		t.Fatalf("%d migrate_secret entries without a key", n)
	}
	warn := logLine(logs.String(), "level=WARN")
	for _, want := range []string{"orders", "--secrets-key-file", secretbox.EnvKey, "restart"} {
		if !strings.Contains(warn, want) {
			t.Errorf("the warning lacks %q: %s", want, warn)
		}
	}
	if strings.Count(logs.String(), "level=WARN") != 1 {
		t.Errorf("want one warning:\n%s", logs)
	}
	if strings.Contains(logs.String(), dbPassword) || strings.Contains(logs.String(), natsPassword) {
		t.Errorf("the log holds a literal:\n%s", logs)
	}
	if prob := conv.Snapshot().Problems["orders"]; !strings.Contains(prob, "a literal password in a tenant's pipeline") {
		t.Errorf("the pipeline's problem: %q", prob)
	}

	migrated, err := conv.MigrateLiteralSecrets(ctx)
	var nk *service.MigrationNeedsKeyError
	if len(migrated) != 0 || !errors.As(err, &nk) || strings.Join(nk.Pipelines, ",") != "orders" || !errors.Is(err, store.ErrNoKey) {
		t.Errorf("migrate without a key: migrated %v, err %v", migrated, err)
	}

	keyed, _ := openStore(t, dsn, ring(t, 1))
	later, _ := newConverger(t, keyed)
	if err := later.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := keyed.Pipeline(ctx, "orders"); p.Version != 2 || strings.Contains(p.Config, natsPassword) {
		t.Errorf("an instance with a key did not migrate: version %d", p.Version)
	}
}

// Two instances starting at once on two connections migrate a pipeline
// once. The test holds the row's lock until both have read the old
// version and wait for it, so both try.
func TestMigrateLiteralSecretsConcurrently(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	first, conn := openStore(t, dsn, ring(t, 1))
	second, _ := openStore(t, dsn, ring(t, 1))
	putRaw(t, first, "orders", "team-a", literalOrders)

	hold, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, `SELECT 1 FROM ferry_pipelines WHERE name = 'orders' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []*store.Store{first, second} {
		conv, _ := newConverger(t, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = conv.Start(ctx)
		}()
	}
	watch, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d instances wait for the row's lock, want 2", waiting)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p, _ := first.Pipeline(ctx, "orders"); p.Version != 2 {
		t.Errorf("version %d after two migrations, want 2", p.Version)
	}
	if n := len(auditOf(t, first, store.ActionMigrateSecret)); n != 1 {
		t.Errorf("%d migrate_secret entries, want 1", n)
	}
	infos, err := first.Secrets(ctx, "team-a")
	if err != nil || len(infos) != 2 || infos[0].Version != 1 || infos[1].Version != 1 {
		t.Errorf("secrets %+v (%v), want two at version 1", infos, err)
	}
}

// logLine is the first line of logs that contains s.
func logLine(logs, s string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
