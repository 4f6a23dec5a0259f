package format

import (
	"net/url"
	"strings"
	"unicode"

	"github.com/ferryhq/ferry/plugins"
)

// The formats a sink's `format:` key names.
const (
	// Raw publishes the payload as the body and Ferry's metadata as headers:
	// the default, and what Ferry always did.
	Raw = "raw"
	// CloudEvents publishes a CloudEvents 1.0 event per the broker's
	// protocol binding (cloudevents.mode: binary or structured).
	CloudEvents = "cloudevents"
	// Envelope publishes a JSON object holding the payload and Ferry's
	// metadata, for consumers that cannot read headers.
	Envelope = "envelope"
)

// CloudEvents content modes.
const (
	// ModeBinary puts the attributes in protocol headers and the payload,
	// untouched, in the body.
	ModeBinary = "binary"
	// ModeStructured puts the whole event, attributes and data, in the body
	// as application/cloudevents+json.
	ModeStructured = "structured"
)

// Config is the part of a sink's section that chooses how events are
// encoded. Sinks embed it inline, so its keys sit beside the sink's own:
//
//	sink:
//	  type: kafka
//	  format: cloudevents
//	  cloudevents: {mode: structured, type_prefix: com.example.}
type Config struct {
	// Format is raw, cloudevents or envelope. Default raw.
	Format string `yaml:"format"`
	// CloudEvents tunes format: cloudevents; setting it with another format
	// is an error.
	CloudEvents CloudEventsConfig `yaml:"cloudevents"`
}

// CloudEventsConfig is the `cloudevents:` block.
type CloudEventsConfig struct {
	// Mode is binary (attributes in headers, payload as the body) or
	// structured (one application/cloudevents+json body). Default binary.
	Mode string `yaml:"mode"`
	// Source is the events' source attribute, a URI: absolute
	// (scheme:...) or an absolute path (/orders). Default
	// ferry://<database>/<table> of the pipeline's outbox.
	Source string `yaml:"source"`
	// TypePrefix is put before the row's event type to make the type
	// attribute, e.g. "com.example.orders." gives
	// "com.example.orders.OrderPlaced". Default "".
	TypePrefix string `yaml:"type_prefix"`
}

// DefaultConfig returns the defaults: raw.
func DefaultConfig() Config { return Config{Format: Raw} }

// Validate reports every problem, named by the sink-relative YAML key.
func (c *Config) Validate() error {
	var p plugins.Problems
	switch c.Format {
	case Raw, Envelope, CloudEvents:
	default:
		p.Add("format", "must be raw, cloudevents or envelope, got %q", c.Format)
	}
	ce := c.CloudEvents
	if c.Format != CloudEvents {
		for _, k := range []struct {
			key string
			set bool
		}{{"mode", ce.Mode != ""}, {"source", ce.Source != ""}, {"type_prefix", ce.TypePrefix != ""}} {
			if k.set {
				p.Add("cloudevents."+k.key, "applies only with format: cloudevents (format is %s)", c.Format)
			}
		}
		return p.Err()
	}
	switch ce.Mode {
	case "", ModeBinary, ModeStructured:
	default:
		p.Add("cloudevents.mode", "must be binary or structured, got %q", ce.Mode)
	}
	if ce.Source != "" {
		if err := checkSource(ce.Source); err != "" {
			p.Add("cloudevents.source", "%q is not a URI: %s", ce.Source, err)
		}
	}
	if strings.IndexFunc(ce.TypePrefix, unicode.IsControl) >= 0 {
		p.Add("cloudevents.type_prefix", "must not hold control characters")
	}
	return p.Err()
}

// checkSource says why s is not a usable source attribute, or "". The
// CloudEvents spec allows any URI-reference and recommends an absolute
// URI; Ferry takes an absolute URI or an absolute path, so a bare word (a
// likely typo for a URI) is refused.
func checkSource(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return "it holds white space or control characters"
	}
	u, err := url.Parse(s)
	if err != nil {
		return strings.TrimPrefix(err.Error(), "parse "+`"`+s+`": `)
	}
	if u.Scheme == "" && !strings.HasPrefix(s, "/") {
		return "want an absolute URI (scheme:...) or an absolute path (/...)"
	}
	return ""
}
