package rabbitmq

import (
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Config is the `sink:` section of a RabbitMQ pipeline.
type Config struct {
	// URL of the broker, amqp:// or amqps:// (TLS), with user, password and
	// vhost. Default amqp://127.0.0.1:5672/ (user guest).
	URL string `yaml:"url"`
	// Exchange Ferry publishes to. Required.
	Exchange string `yaml:"exchange"`
	// ExchangeType is the kind of exchange declare creates: topic, direct,
	// fanout or headers. Default topic.
	ExchangeType string `yaml:"exchange_type"`
	// Declare creates the exchange (durable) at start if missing; an
	// exchange that exists is never changed (one of another type fails the
	// start). Without it, start fails when it does not exist. Default false.
	Declare bool `yaml:"declare"`
	// RoutingKey is the routing key of a message no transform chose a topic
	// for: text with ${metadata_key} placeholders filled per message, e.g.
	// "outbox.${aggregate_type}.${event_type}" ($$ is a literal $; no
	// environment variables here). Required.
	RoutingKey string `yaml:"routing_key" ferry:"template"`
	// Channels is how many AMQP channels publish concurrently, each with
	// many confirms outstanding. Default 4.
	Channels int `yaml:"channels"`
	// PublishTimeout bounds the wait for the broker's confirm. Default 5s.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// ReconnectInterval is the least time between two connection attempts
	// while the broker is unreachable; publishes in between fail at once.
	// Default 1s.
	ReconnectInterval time.Duration `yaml:"reconnect_interval"`
	// TLS verifies the broker of an amqps:// URL and, for mutual TLS,
	// presents a client certificate. Default: amqps:// uses the system roots.
	TLS TLSConfig `yaml:"tls"`
	// ConsumerQueues are the queues Ferry's consumers read; `ferry doctor`
	// reports the messages waiting in them. Default none.
	ConsumerQueues []string `yaml:"consumer_queues"`
	// Encoding is how events are encoded: the format key (raw,
	// cloudevents, envelope) and the cloudevents block, inline; see package
	// sinks/format. Default raw.
	Encoding format.Config `yaml:",inline"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{
		URL:               "amqp://127.0.0.1:5672/",
		ExchangeType:      amqp.ExchangeTopic,
		Channels:          4,
		PublishTimeout:    5 * time.Second,
		ReconnectInterval: time.Second,
		Encoding:          format.DefaultConfig(),
	}
}

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	uri, err := amqp.ParseURI(c.URL)
	switch {
	case c.URL == "":
		p.Add("url", "must not be empty")
	case err != nil:
		// Not quoted: redaction cannot find the password in a malformed URL.
		p.Add("url", "not an AMQP URL like amqp://user:password@host:5672/vhost: %v", redact.Unparsed(err))
	case c.TLS.Enabled && uri.Scheme != "amqps":
		p.Add("tls.enabled", "needs an amqps:// url")
	}
	if c.Exchange == "" {
		p.Add("exchange", "must not be empty")
	} else if len(c.Exchange) > 255 {
		p.Add("exchange", "must be at most 255 bytes")
	} else if i := plugins.ControlCharacter(c.Exchange); i >= 0 {
		p.Add("exchange", "has a control character (byte 0x%02x at %d)", c.Exchange[i], i)
	}
	switch c.ExchangeType {
	case amqp.ExchangeTopic, amqp.ExchangeDirect, amqp.ExchangeFanout, amqp.ExchangeHeaders:
	default:
		p.Add("exchange_type", "must be topic, direct, fanout or headers, got %q", c.ExchangeType)
	}
	if c.RoutingKey == "" {
		p.Add("routing_key", "must not be empty")
	} else if _, err := parseTemplate(c.RoutingKey); err != nil {
		p.Add("routing_key", "%v", err)
	} else if i := plugins.ControlCharacter(c.RoutingKey); i >= 0 {
		p.Add("routing_key", "has a control character (byte 0x%02x at %d)", c.RoutingKey[i], i)
	}
	if c.Channels < 1 || c.Channels > 1000 {
		p.Add("channels", "must be between 1 and 1000, got %d", c.Channels)
	}
	if c.PublishTimeout < time.Millisecond {
		p.Add("publish_timeout", "must be at least 1ms, got %s", c.PublishTimeout)
	}
	if c.ReconnectInterval < 0 {
		p.Add("reconnect_interval", "must not be negative")
	}
	p.Nest("tls", c.TLS.Validate())
	p = append(p, plugins.Flatten(c.Encoding.Validate())...)
	for i, q := range c.ConsumerQueues {
		path := fmt.Sprintf("consumer_queues[%d]", i)
		switch {
		case q == "":
			p.Add(path, "must not be empty")
		case len(q) > 255:
			p.Add(path, "must be at most 255 bytes")
		default:
			if j := plugins.ControlCharacter(q); j >= 0 {
				p.Add(path, "has a control character (byte 0x%02x at %d)", q[j], j)
			}
		}
	}
	return p.Err()
}

// template is a routing key with ${metadata_key} placeholders; $$ is a
// literal $.
type template struct {
	parts []templatePart
}

type templatePart struct {
	text string // literal text, or the metadata key when key is true
	key  bool
}

func parseTemplate(s string) (template, error) {
	var t template
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			lit.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			lit.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			return template{}, fmt.Errorf("lone $ in %q (write $$ for a literal $)", s)
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return template{}, fmt.Errorf("unterminated ${ in %q", s)
		}
		key := s[i+2 : i+end]
		if key == "" || strings.ContainsAny(key, "${ \t") {
			return template{}, fmt.Errorf("${%s} is not a metadata key placeholder", key)
		}
		if lit.Len() > 0 {
			t.parts = append(t.parts, templatePart{text: lit.String()})
			lit.Reset()
		}
		t.parts = append(t.parts, templatePart{text: key, key: true})
		i += end
	}
	if lit.Len() > 0 {
		t.parts = append(t.parts, templatePart{text: lit.String()})
	}
	return t, nil
}

// render fills the placeholders from md. A missing or empty value is an
// error: a routing key with a hole would send the event somewhere else;
// so is a value with a control character.
func (t template) render(md map[string]string) (string, error) {
	if len(t.parts) == 1 && !t.parts[0].key {
		return t.parts[0].text, nil
	}
	var b strings.Builder
	for _, p := range t.parts {
		if !p.key {
			b.WriteString(p.text)
			continue
		}
		v := md[p.text]
		if v == "" {
			return "", fmt.Errorf("routing_key: the message has no %q metadata", p.text)
		}
		// The engine checks the topics it is given; a key rendered here
		// from the row is seen by no one else.
		if plugins.ControlCharacter(v) >= 0 {
			return "", fmt.Errorf("routing_key: the message's %q metadata has a control character", p.text)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}
