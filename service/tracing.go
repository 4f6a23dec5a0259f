package service

import (
	"context"
	"log/slog"
	"time"

	"github.com/ferryhq/ferry/tracing"
)

// flushTraces sends the spans the OTLP exporter still holds before the
// process exits, waiting at most a few seconds for an unreachable
// collector.
func flushTraces(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tracing.Shutdown(ctx); err != nil {
		log.Warn("flush traces", "err", err)
	}
}
