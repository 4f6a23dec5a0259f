package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// InstanceStatus is a pipeline's state on the instance that runs it, as
// that instance last reported it: any instance's API can say who runs a
// pipeline and how it is doing, not only the owner's.
type InstanceStatus struct {
	Pipeline   string    `json:"-"`
	Instance   string    `json:"instance"`
	State      string    `json:"state"`
	LastError  string    `json:"last_error,omitempty"`
	Starts     int       `json:"starts"`
	Since      time.Time `json:"since"`
	ReportedAt time.Time `json:"reported_at"`
}

// ReportStatuses replaces what instance reported before with sts (the
// pipelines it runs, not those it holds in standby).
func (s *Store) ReportStatuses(ctx context.Context, instance string, sts []InstanceStatus) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM ferry_pipeline_status WHERE instance = $1`, instance); err != nil {
			return err
		}
		rows := make([][]any, len(sts))
		for i, st := range sts {
			rows[i] = []any{st.Pipeline, instance, st.State, st.LastError, st.Starts, st.Since}
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"ferry_pipeline_status"},
			[]string{"pipeline", "instance", "state", "last_error", "starts", "since"}, pgx.CopyFromRows(rows))
		return err
	})
}

// Statuses returns what instances reported within the last fresh, by
// pipeline: a dead instance's reports age out. It also forgets reports far
// older than that.
func (s *Store) Statuses(ctx context.Context, fresh time.Duration) (map[string][]InstanceStatus, error) {
	if _, err := s.pool.Exec(ctx, `DELETE FROM ferry_pipeline_status WHERE reported_at < now() - make_interval(secs => $1) * 10`, fresh.Seconds()); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT pipeline, instance, state, last_error, starts, since, reported_at
		FROM ferry_pipeline_status WHERE reported_at >= now() - make_interval(secs => $1) ORDER BY pipeline, reported_at DESC`, fresh.Seconds())
	if err != nil {
		return nil, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InstanceStatus, error) {
		var st InstanceStatus
		return st, r.Scan(&st.Pipeline, &st.Instance, &st.State, &st.LastError, &st.Starts, &st.Since, &st.ReportedAt)
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]InstanceStatus{}
	for _, st := range list {
		out[st.Pipeline] = append(out[st.Pipeline], st)
	}
	return out, nil
}
