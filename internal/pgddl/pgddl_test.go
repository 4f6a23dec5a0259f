package pgddl_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/pgddl"
	"github.com/ferryhq/ferry/lab/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Many sessions creating the same table at once all succeed (a plain
// CREATE TABLE IF NOT EXISTS fails some of them with unique_violation).
func TestConcurrentCreate(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for round := range 5 {
		sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS t%d (id int PRIMARY KEY)`, round)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- pgddl.CreateIfMissing(context.Background(), pool, sql) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
}
