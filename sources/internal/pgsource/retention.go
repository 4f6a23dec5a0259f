package pgsource

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Retention deletes delivered rows from the outbox so it does not grow
// forever. Each source decides what "delivered" means; none ever deletes a
// row that was not.
type Retention struct {
	// After is how long a delivered row is kept. Default 24h.
	After time.Duration `yaml:"after"`
	// Every is how often retention runs. Default 1m.
	Every time.Duration `yaml:"every"`
	// Batch is the most rows one DELETE removes; a run repeats until a
	// batch comes back short. Default 5000.
	Batch int `yaml:"batch"`
}

// Defaults fills unset fields.
func (r *Retention) Defaults() {
	if r.After == 0 && r.Every == 0 && r.Batch == 0 {
		r.After = 24 * time.Hour
	}
	if r.Every == 0 {
		r.Every = time.Minute
	}
	if r.Batch == 0 {
		r.Batch = 5000
	}
}

// Validate reports every bad field.
func (r *Retention) Validate() error {
	var p plugins.Problems
	if r.After < 0 {
		p.Add("after", "must not be negative")
	}
	if r.Every < 10*time.Millisecond {
		p.Add("every", "must be at least 10ms, got %s", r.Every)
	}
	if r.Batch < 1 || r.Batch > 100000 {
		p.Add("batch", "must be between 1 and 100000, got %d", r.Batch)
	}
	return p.Err()
}

// RunRetention calls deleteBatch every r.Every — repeatedly while batches
// come back full — until ctx ends, counting deleted rows in
// ferry_retention_deleted_total.
func RunRetention(ctx context.Context, r *Retention, reg prometheus.Registerer, log *slog.Logger, deleteBatch func(context.Context) (int64, error)) {
	deleted := prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_retention_deleted_total",
		Help: "Delivered outbox rows deleted by retention."})
	if reg != nil {
		if err := reg.Register(deleted); err != nil {
			log.Warn("register retention metric", "err", err)
		}
	}
	t := time.NewTicker(r.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var run int64
		for ctx.Err() == nil {
			n, err := deleteBatch(ctx)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("retention", "err", redact.Error(err))
				}
				break
			}
			run += n
			deleted.Add(float64(n))
			if n < int64(r.Batch) {
				break
			}
		}
		if run > 0 {
			log.Info("retention deleted delivered rows", "rows", run, "older_than", r.After)
		}
	}
}
