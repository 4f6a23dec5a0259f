package nats

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Config is the `sink:` section of a NATS JetStream pipeline.
type Config struct {
	// URL of the NATS server(s), comma-separated. Default nats://127.0.0.1:4222.
	URL string `yaml:"url"`
	// Subject is where a message goes when no transform chose a topic. Required.
	Subject string `yaml:"subject"`
	// PublishTimeout bounds the wait for a JetStream PubAck. Default 5s.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// PingInterval is how often the client pings the server; two pings
	// unanswered end the connection, and it reconnects. A connection that
	// died without an error (a network partition, a NAT that forgot it)
	// is noticed within about three intervals. Default 5s.
	PingInterval time.Duration `yaml:"ping_interval"`
	// CreateStream, when set, makes the stream ready at start: creates it
	// if absent (marked in its metadata as created by Ferry for the
	// pipeline's tenant and by the pipeline), updates it to these settings
	// if it is marked as the tenant's (for a pipeline without a tenant:
	// also if it is unmarked), and otherwise uses it as it is when it
	// captures the pipeline's subjects, or fails saying it is not the
	// tenant's. Ferry never changes another tenant's stream. Default none.
	CreateStream *StreamConfig `yaml:"create_stream"`
	// User and Password authenticate with a user name and password; the URL
	// may carry them instead (nats://user:password@host). Default none.
	User string `yaml:"user"`
	// Password of user; never logged. Default none.
	Password string `yaml:"password" ferry:"secret"`
	// Token authenticates with a token; the URL may carry it instead
	// (nats://token@host). Never logged. Default none.
	Token string `yaml:"token" ferry:"secret"`
	// CredentialsFile is a NATS .creds file (user JWT and NKey seed), for
	// operator/account deployments. Default none.
	CredentialsFile string `yaml:"credentials_file" ferry:"file"`
	// TLS secures the connection (tls:// URLs need it, or use system roots).
	// Default off.
	TLS TLSConfig `yaml:"tls"`
	// Encoding is how events are encoded: the format key (raw,
	// cloudevents, envelope) and the cloudevents block, inline; see package
	// sinks/format. Default raw.
	Encoding format.Config `yaml:",inline"`
}

// StreamConfig describes the stream Ferry creates for its subjects.
type StreamConfig struct {
	// Name of the stream (letters, digits, _ and -). For a tenant's
	// pipeline it must start with one of the tenant's destination
	// prefixes, written with _ for each character a stream name cannot
	// hold: the prefix orders. allows orders_events. Required.
	Name string `yaml:"name"`
	// Subjects the stream captures. Default: the sink's subject.
	Subjects []string `yaml:"subjects"`
	// Storage is file or memory. Default file.
	Storage string `yaml:"storage"`
	// Replicas is the stream's replication factor. Default 1.
	Replicas int `yaml:"replicas"`
	// MaxAge drops messages older than this; 0 keeps them. Default 0.
	MaxAge time.Duration `yaml:"max_age"`
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id (the
	// event id) to drop re-sends of it, on any subject of the stream: a
	// crash's re-sends, and every pipeline's but the first when several
	// publish one outbox table's events into the stream (each is counted
	// in duplicates_total). A backfill's, a reset's back and a dead-letter
	// topic replay's events carry ids of their own and are stored.
	// Default 2m.
	DuplicateWindow time.Duration `yaml:"duplicate_window"`
	// Retention is limits (keep until a limit is hit), interest (until every
	// consumer acked) or workqueue (until one consumer acked). Default limits.
	Retention string `yaml:"retention"`
	// Discard is what a full stream drops: old messages, or new ones — then a
	// publish fails rather than evicting undelivered events. Default old.
	Discard string `yaml:"discard"`
	// MaxMsgs caps the messages the stream keeps; 0 is unlimited. Default 0.
	MaxMsgs int64 `yaml:"max_msgs"`
	// MaxBytes caps the stream's size in bytes; 0 is unlimited. Default 0.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxMsgSize is the largest message the stream accepts, in bytes; 0 is
	// the server's limit. Default 0.
	MaxMsgSize int32 `yaml:"max_msg_size"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() *Config {
	return &Config{URL: "nats://127.0.0.1:4222", PublishTimeout: 5 * time.Second, PingInterval: 5 * time.Second,
		Encoding: format.DefaultConfig()}
}

var streamName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// Validate reports every problem, named by YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	if c.URL == "" {
		p.Add("url", "must not be empty")
	}
	for _, u := range strings.Split(c.URL, ",") {
		// Not quoted: redaction cannot find the token in a malformed URL
		// (nats:/token@h parses, with no host and the token in its path).
		if pu, err := url.Parse(strings.TrimSpace(u)); err != nil {
			p.Add("url", "not a NATS URL like nats://host:4222: %v", redact.Unparsed(err))
		} else if pu.Host == "" {
			p.Add("url", "not a NATS URL like nats://host:4222: no host")
		}
	}
	if c.Subject == "" {
		p.Add("subject", "must not be empty")
	} else if i := plugins.ControlCharacter(c.Subject); i >= 0 {
		p.Add("subject", "has a control character (byte 0x%02x at %d): a CR or LF would end the protocol line it is sent on", c.Subject[i], i)
	} else if !validSubject(c.Subject, false) {
		p.Add("subject", "%q is not a NATS subject (dot-separated tokens, no spaces or wildcards)", c.Subject)
	} else if why := serverSubject(c.Subject); why != "" {
		p.Add("subject", "%q is %s: no pipeline may publish to it", c.Subject, why)
	}
	if c.PublishTimeout <= 0 {
		p.Add("publish_timeout", "must be positive")
	}
	if c.PingInterval <= 0 {
		p.Add("ping_interval", "must be positive")
	}
	if c.CreateStream != nil {
		p.Nest("create_stream", c.CreateStream.validate())
	}
	if c.Token != "" && (c.User != "" || c.Password != "") {
		p.Add("token", "use either token or user and password, not both")
	}
	if (c.User == "") != (c.Password == "") {
		p.Add("user", "user and password go together")
	}
	if c.CredentialsFile != "" {
		if c.Token != "" || c.User != "" {
			p.Add("credentials_file", "use either credentials_file or user/password/token, not both")
		}
		if _, err := os.Stat(c.CredentialsFile); err != nil {
			p.Add("credentials_file", "cannot read %s: %v", c.CredentialsFile, errors.Unwrap(err))
		}
	}
	p.Nest("tls", c.TLS.Validate())
	p = append(p, plugins.Flatten(c.Encoding.Validate())...)
	return p.Err()
}

// validate reports the stream's problems, named by YAML key under
// create_stream.
func (s *StreamConfig) validate() error {
	var p plugins.Problems
	if !streamName.MatchString(s.Name) {
		p.Add("name", "%q is not a stream name (letters, digits, _ and -)", s.Name)
	}
	for i, subj := range s.Subjects {
		path := fmt.Sprintf("subjects[%d]", i)
		switch {
		case plugins.ControlCharacter(subj) >= 0:
			p.Add(path, "has a control character")
		case !validSubject(subj, true):
			p.Add(path, "%q is not a subject", subj)
		case serverSubject(subj) != "":
			p.Add(path, "%q is %s: no stream may capture it", subj, serverSubject(subj))
		}
	}
	if s.Storage != "" && s.Storage != "file" && s.Storage != "memory" {
		p.Add("storage", "must be file or memory, got %q", s.Storage)
	}
	if s.Replicas < 0 || s.Replicas > 5 {
		p.Add("replicas", "must be between 1 and 5")
	}
	if s.MaxAge < 0 || s.DuplicateWindow < 0 {
		p.Add("", "durations must not be negative")
	}
	switch s.Retention {
	case "", "limits", "interest", "workqueue":
	default:
		p.Add("retention", "must be limits, interest or workqueue, got %q", s.Retention)
	}
	switch s.Discard {
	case "", "old", "new":
	default:
		p.Add("discard", "must be old or new, got %q", s.Discard)
	}
	if s.MaxMsgs < 0 {
		p.Add("max_msgs", "must not be negative")
	}
	if s.MaxBytes < 0 {
		p.Add("max_bytes", "must not be negative")
	}
	if s.MaxMsgSize < 0 {
		p.Add("max_msg_size", "must not be negative")
	}
	return p.Err()
}

// serverSubject says whose subject s is when it is the server's own: a
// message to $JS.API.STREAM.DELETE.<name> deletes the stream, one to
// $SYS. speaks to the system account; an outbox row must never be a
// command to the server, so no pipeline may publish there, the admin's
// included. ($KV. and $O. are left to the admin: publishing to
// $KV.<bucket>.<key> is how a key-value bucket is written; the tenant
// policy refuses every $ subject to a tenant.)
func serverSubject(s string) string {
	switch {
	case s == "$JS" || strings.HasPrefix(s, "$JS."):
		return "JetStream's API"
	case s == "$SYS" || strings.HasPrefix(s, "$SYS."):
		return "the system account's"
	}
	return ""
}

// validSubject checks NATS subject syntax; wildcards only where allowed.
func validSubject(s string, wildcards bool) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return false
		case t == "*" || (t == ">" && i == len(toks)-1):
			if !wildcards {
				return false
			}
		case strings.ContainsAny(t, "*>"):
			return false
		}
	}
	return true
}

// DeduplicationScope is the stream the sink publishes into, as far as the
// config tells without asking the server: the servers' hosts and the
// create_stream name or, without one, the subject's prefix (the subject
// without its last token; streams usually capture `prefix.>`). JetStream
// drops a Nats-Msg-Id seen within the stream's duplicate window on any of
// its subjects.
func (c *Config) DeduplicationScope() string {
	var hosts []string
	for _, u := range strings.Split(c.URL, ",") {
		if pu, err := url.Parse(strings.TrimSpace(u)); err == nil && pu.Host != "" {
			hosts = append(hosts, pu.Host)
		}
	}
	where := strings.Join(hosts, ",")
	if c.CreateStream != nil && c.CreateStream.Name != "" {
		return where + " stream " + c.CreateStream.Name
	}
	i := strings.LastIndexByte(c.Subject, '.')
	if i <= 0 {
		return where + " subject " + c.Subject
	}
	return where + " subjects " + c.Subject[:i] + ".>"
}

var _ plugins.DeduplicationScoper = (*Config)(nil)
