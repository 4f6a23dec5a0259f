package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/plugins"
)

// DryStart connects as Start does but declares nothing: the exchange is
// looked up (a passive declare), and with declare: true a missing one is
// the note "would create exchange X" (plugins.DryStarter).
func (s *Sink) DryStart(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	s.dry = true
	s.mu.Unlock()
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.notes...), nil
}

// lookUpExchange checks the exchange exists on ch (which a failed check
// closes), as the sink would use it. Called with s.mu held.
func (s *Sink) lookUpExchange(ch *amqp.Channel) error {
	err := ch.ExchangeDeclarePassive(s.cfg.Exchange, s.cfg.ExchangeType, true, false, false, false, nil)
	var ae *amqp.Error
	switch {
	case err == nil:
		return nil
	case s.cfg.Declare && errors.As(err, &ae) && ae.Code == amqp.NotFound:
		s.notes = append(s.notes, "would create exchange "+s.cfg.Exchange)
		return nil
	case s.cfg.Declare:
		return fmt.Errorf("exchange %s: %w", s.cfg.Exchange, err)
	}
	return fmt.Errorf("exchange %s: %w (create it, or set declare: true)", s.cfg.Exchange, err)
}

var _ plugins.DryStarter = (*Sink)(nil)
