package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/store"
)

// The status table works the same on a store and on a database that is
// not one (created on first use): a publication replaces the instance's
// rows, keeps the others', and a read returns each with its full status
// and its age by the database's clock.
func TestStatusTable(t *testing.T) {
	ctx := context.Background()
	s, err := store.Open(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plain, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for name, table := range map[string]*store.StatusTable{"store": s.StatusTable(), "coordination database": store.NewStatusTable(plain)} {
		since := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
		full := json.RawMessage(`{"state": "backing_off", "health": {"backlog": 7}}`)
		if err := table.Publish(ctx, "a", []store.InstanceStatus{{Pipeline: "orders", State: "running", Since: since},
			{Pipeline: "old", State: "running", Since: since}}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := table.Publish(ctx, "b", []store.InstanceStatus{{Pipeline: "billing", State: "running", Since: since}}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := table.Publish(ctx, "a", []store.InstanceStatus{{Pipeline: "orders", State: "backing_off", LastError: "down",
			Starts: 2, Since: since, Status: full}}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := table.Read(ctx, time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		by := map[string]store.InstanceStatus{}
		for _, r := range got {
			by[r.Instance+"/"+r.Pipeline] = r
		}
		o, ok := by["a/orders"]
		if len(got) != 2 || !ok || by["b/billing"].State != "running" {
			t.Fatalf("%s: read %+v; want a/orders and b/billing only (a's old row replaced)", name, got)
		}
		var st struct {
			Health struct{ Backlog int } `json:"health"`
		}
		if err := json.Unmarshal(o.Status, &st); err != nil || o.State != "backing_off" || o.LastError != "down" || o.Starts != 2 ||
			!o.Since.Equal(since) || st.Health.Backlog != 7 || o.Age < 0 || o.Age > 30*time.Second {
			t.Errorf("%s: a/orders = %+v (status %s); want the second publication, with its full status and a small age", name, o, o.Status)
		}
		if err := table.Publish(ctx, "a", nil); err != nil {
			t.Fatal(err)
		}
		if got, _ := table.Read(ctx, time.Minute); len(got) != 1 {
			t.Errorf("%s: after a withdrew, %d reports; want b's alone", name, len(got))
		}
	}
}
