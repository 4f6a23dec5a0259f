package service

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/store"
)

// statusBoard is the engine's status board (engine.StatusBoard) on the
// HA coordination database, beside the heartbeat table: the store's
// ferry_pipeline_status when the store is the coordination database, the
// same table created on first use when it is not. Each instance publishes
// the full status of the pipelines it runs (engine.Status as JSON) and
// reads everyone's, so every instance's API, `ferry lag`, doctor and
// console say the same of each pipeline.
type statusBoard struct {
	pool  *pgxpool.Pool
	table *store.StatusTable
}

// openStatusBoard makes the board on dsn. The pool connects on first use.
func openStatusBoard(dsn string) (*statusBoard, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("status board: %w", redact.Unparsed(err))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "ferry:status"
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("status board: %w", redact.Error(err))
	}
	return &statusBoard{pool: pool, table: store.NewStatusTable(pool)}, nil
}

func (b *statusBoard) close() { b.pool.Close() }

// Publish replaces what instance published with sts, in one statement.
func (b *statusBoard) Publish(ctx context.Context, instance string, sts []engine.Status) error {
	rows := make([]store.InstanceStatus, len(sts))
	for i, st := range sts {
		full, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("pipeline %q: %w", st.Name, err)
		}
		rows[i] = store.InstanceStatus{Pipeline: st.Name, State: string(st.State), LastError: st.LastError,
			Starts: st.Starts, Since: st.Since, Status: full}
	}
	return b.table.Publish(ctx, instance, rows)
}

// Read returns every full status published within the last within; a
// row without one (an older instance's report) is left out.
func (b *statusBoard) Read(ctx context.Context, within time.Duration) ([]engine.PublishedStatus, error) {
	list, err := b.table.Read(ctx, within)
	if err != nil {
		return nil, err
	}
	out := make([]engine.PublishedStatus, 0, len(list))
	for _, r := range list {
		if len(r.Status) == 0 {
			continue
		}
		var st engine.Status
		if err := json.Unmarshal(r.Status, &st); err != nil {
			continue // not this version's shape: as if not reported
		}
		st.Name = r.Pipeline
		out = append(out, engine.PublishedStatus{Instance: r.Instance, Status: st, ReportedAt: r.ReportedAt, Age: r.Age})
	}
	return out, nil
}

var _ engine.StatusBoard = (*statusBoard)(nil)
