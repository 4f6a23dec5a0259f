package nats

import (
	"context"
	"errors"
	"fmt"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// Read delivers every message published to topic from now on (a core NATS
// subscription, so it sees what reaches the server, stream or not) until ctx
// ends. The canary checker reads its topic back this way.
func (s *Sink) Read(ctx context.Context, topic string, handle func(*message.Message)) error {
	s.mu.Lock()
	conn, closed := s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("nats sink: closed")
	}
	if conn == nil {
		return errors.New("nats sink: not started")
	}
	msgs := make(chan *nats.Msg, 64)
	sub, err := conn.ChanSubscribe(topic, msgs)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			id := m.Header.Get(wmnats.WatermillUUIDHdr)
			if id == "" {
				id = m.Header.Get(nats.MsgIdHdr)
			}
			wm := message.NewMessage(id, m.Data)
			for k := range m.Header {
				wm.Metadata.Set(k, m.Header.Get(k))
			}
			handle(wm)
		}
	}
}

var _ plugins.Reader = (*Sink)(nil)

// Ping checks the server answers: a round trip on the connection.
func (s *Sink) Ping(ctx context.Context) error {
	s.mu.Lock()
	conn, closed := s.conn, s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("nats sink: closed")
	}
	if conn == nil {
		return errors.New("nats sink: not started")
	}
	if !conn.IsConnected() {
		return s.rootCause(conn, fmt.Errorf("not connected to %s (status %s)", redact.String(s.cfg.URL), conn.Status()))
	}
	return conn.FlushWithContext(ctx)
}

var _ plugins.Pinger = (*Sink)(nil)
