package rabbitmq

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry/plugins"
)

// ConsumerLag reports, for each queue in consumer_queues, the messages
// waiting in it (ready, not yet delivered to a consumer): the ack→consumed
// segment `ferry doctor` checks. Nothing when no queues are configured.
func (s *Sink) ConsumerLag(ctx context.Context) ([]plugins.GroupLag, error) {
	if len(s.cfg.ConsumerQueues) == 0 {
		return nil, nil
	}
	sess, err := s.current()
	if err != nil {
		return nil, err
	}
	type result struct {
		lags []plugins.GroupLag
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var out []plugins.GroupLag
		for _, q := range s.cfg.ConsumerQueues {
			// A passive declare of a missing queue closes its channel: one
			// channel per queue.
			ch, err := sess.conn.Channel()
			if err != nil {
				done <- result{nil, err}
				return
			}
			st, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			_ = ch.Close()
			if err != nil {
				done <- result{nil, fmt.Errorf("queue %s: %w", q, err)}
				return
			}
			out = append(out, plugins.GroupLag{Group: q, Topic: s.cfg.Exchange, Lag: int64(st.Messages)})
		}
		done <- result{out, nil}
	}()
	select {
	case r := <-done:
		return r.lags, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

var _ plugins.ConsumerLagger = (*Sink)(nil)
