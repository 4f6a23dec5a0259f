package kafka

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// scramClient adapts franz-go's SCRAM implementation (RFC 5802) to Sarama,
// which leaves the SCRAM client to the application.
func scramClient(mechanism string) func() sarama.SCRAMClient {
	return func() sarama.SCRAMClient { return &scramConversation{mechanism: mechanism} }
}

type scramConversation struct {
	mechanism string
	session   sasl.Session
	first     []byte
	done      bool
}

// Begin prepares the client-first message.
func (c *scramConversation) Begin(user, password, authzID string) error {
	auth := scram.Auth{User: user, Pass: password, Zid: authzID}
	m := auth.AsSha256Mechanism()
	if c.mechanism == "SCRAM-SHA-512" {
		m = auth.AsSha512Mechanism()
	}
	s, first, err := m.Authenticate(context.Background(), "")
	if err != nil {
		return err
	}
	c.session, c.first = s, first
	return nil
}

// Step answers the server's challenge; the first call, with no challenge,
// returns the client-first message.
func (c *scramConversation) Step(challenge string) (string, error) {
	if c.session == nil {
		return "", errors.New("scram: Step before Begin")
	}
	if c.first != nil {
		first := c.first
		c.first = nil
		return string(first), nil
	}
	done, msg, err := c.session.Challenge([]byte(challenge))
	if err != nil {
		return "", err
	}
	c.done = done
	return string(msg), nil
}

// Done reports whether the server's final message was verified.
func (c *scramConversation) Done() bool { return c.done }
