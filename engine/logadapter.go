package engine

import (
	"github.com/ThreeDotsLabs/watermill"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
)

// quietHandlerErrors is the router's logger: Watermill's slog adapter,
// with handler start/stop lines (Info) demoted to debug detail, and its
// per-event error lines too: a broker outage would log every event of
// every retry. The pipeline's state, last error and one log line per
// failing episode say it instead.
//
// An error about a pipeline's handler (Watermill names it in handler_name)
// is masked with the pipeline's spec, as the pipeline's own lines are.
type quietHandlerErrors struct {
	watermill.LoggerAdapter
	specOf  func(pipeline string) *pipelines.Spec // nil: nothing to mask
	handler string                                // from With, when it named one
}

func (q quietHandlerErrors) Error(msg string, err error, fields watermill.LogFields) {
	handler := q.handler
	if h, ok := fields["handler_name"].(string); ok {
		handler = h
	}
	if q.specOf != nil && err != nil {
		err = q.specOf(handler).MaskError(redact.Error(err))
	}
	switch msg {
	case "Handler returned error", "Error occurred, retrying":
		q.LoggerAdapter.Debug(msg+": "+redact.String(err.Error()), fields)
	default:
		q.LoggerAdapter.Error(msg, err, fields)
	}
}

func (q quietHandlerErrors) With(fields watermill.LogFields) watermill.LoggerAdapter {
	handler := q.handler
	if h, ok := fields["handler_name"].(string); ok {
		handler = h
	}
	return quietHandlerErrors{LoggerAdapter: q.LoggerAdapter.With(fields), specOf: q.specOf, handler: handler}
}
