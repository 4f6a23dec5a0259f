package format_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  format.Config
		want []string // every problem, by its message prefix
	}{
		{"default", format.DefaultConfig(), nil},
		{"envelope", format.Config{Format: format.Envelope}, nil},
		{"cloudevents defaults", format.Config{Format: format.CloudEvents}, nil},
		{"structured with a URI source", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{
			Mode: "structured", Source: "https://example.com/orders", TypePrefix: "com.example."}}, nil},
		{"path source", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Source: "/orders/outbox"}}, nil},
		{"urn source", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Source: "urn:example:orders"}}, nil},
		{"unknown format", format.Config{Format: "avro"}, []string{`format: must be raw, cloudevents or envelope, got "avro"`}},
		{"mode without cloudevents", format.Config{Format: format.Raw, CloudEvents: format.CloudEventsConfig{Mode: "binary"}},
			[]string{"cloudevents.mode: applies only with format: cloudevents (format is raw)"}},
		{"every key without cloudevents", format.Config{Format: format.Envelope, CloudEvents: format.CloudEventsConfig{Mode: "binary", Source: "/x", TypePrefix: "p."}},
			[]string{"cloudevents.mode: applies only", "cloudevents.source: applies only", "cloudevents.type_prefix: applies only"}},
		{"bad mode", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Mode: "batch"}},
			[]string{`cloudevents.mode: must be binary or structured, got "batch"`}},
		{"bare word source", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Source: "orders"}},
			[]string{`cloudevents.source: "orders" is not a URI: want an absolute URI`}},
		{"source with a space", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Source: "https://x/a b"}},
			[]string{`cloudevents.source: "https://x/a b" is not a URI: it holds white space`}},
		{"unparsable source", format.Config{Format: format.CloudEvents, CloudEvents: format.CloudEventsConfig{Source: "https://[::1"}},
			[]string{`cloudevents.source: "https://[::1" is not a URI: missing ']' in host`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			errs := plugins.Flatten(c.cfg.Validate())
			if len(errs) != len(c.want) {
				t.Fatalf("got %d problems %v, want %d %q", len(errs), errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("problem %d: %q, want it to start with %q", i, errs[i], w)
				}
			}
		})
	}
}

// TestYAMLErrorsNameTheKey: through the loader, every sink reports the
// format's problems at the key the user wrote, with its line, and an
// unknown key inside cloudevents is refused.
func TestYAMLErrorsNameTheKey(t *testing.T) {
	sinks := map[string]string{
		"kafka":    "brokers: [b:9092]\n  topic: t",
		"nats":     "subject: s",
		"rabbitmq": "exchange: x\n  routing_key: k",
	}
	for typ, keys := range sinks {
		t.Run(typ, func(t *testing.T) {
			doc := "name: p\nsource: {type: xid8, dsn: postgres://h/db}\nsink:\n  type: " + typ + "\n  " + keys +
				"\n  format: raw\n  cloudevents:\n    mode: structured\n    source: not a uri\n"
			_, err := pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc))
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range []string{"sink.cloudevents.mode: applies only with format: cloudevents",
				"sink.cloudevents.source: applies only with format: cloudevents"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			doc = "name: p\nsource: {type: xid8, dsn: postgres://h/db}\nsink:\n  type: " + typ + "\n  " + keys +
				"\n  format: cloudevents\n  cloudevents:\n    typo: 1\n"
			_, err = pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc))
			for _, w := range []string{"sink.cloudevents.typo: unknown key (valid keys: mode, source, type_prefix)"} {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			doc = "name: p\nsource: {type: xid8, dsn: postgres://h/db}\nsink:\n  type: " + typ + "\n  " + keys +
				"\n  format: cloudevents\n  cloudevents: {source: orders}\n"
			_, err = pipelines.Loader{}.LoadBytes("p.yaml", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), `sink.cloudevents.source: "orders" is not a URI`) {
				t.Errorf("error %v, want sink.cloudevents.source named", err)
			}
			doc = "name: p\nsource: {type: xid8, dsn: postgres://h/db}\nsink:\n  type: " + typ + "\n  " + keys +
				"\n  format: cloudevents\n  cloudevents: {mode: structured}\n"
			if _, err := (pipelines.Loader{}).LoadBytes("p.yaml", []byte(doc)); err != nil {
				t.Errorf("valid format rejected: %v", err)
			}
		})
	}
}

// The default source names the outbox's database and table (Env.Origin;
// the engine reads them from the source's DSN without its credentials,
// engine.TestOriginOf), or the pipeline without one.
func TestDefaultSource(t *testing.T) {
	for _, c := range []struct {
		env  plugins.Env
		want string
	}{
		{plugins.Env{Pipeline: "orders", Origin: plugins.Origin{Database: "shop", Table: "public.outbox"}}, "ferry://shop/public.outbox"},
		{plugins.Env{Pipeline: "orders", Origin: plugins.Origin{Database: "shop", Table: "outbox"}}, "ferry://shop/outbox"},
		{plugins.Env{Pipeline: "orders", Origin: plugins.Origin{Database: "inv", Table: "public.outbox"}}, "ferry://inv/public.outbox"},
		{plugins.Env{Pipeline: "orders", Origin: plugins.Origin{Table: "public.outbox"}}, "ferry://orders/public.outbox"},
		{plugins.Env{Pipeline: "orders"}, "ferry://orders"},
	} {
		if got := format.DefaultSource(c.env); got != c.want {
			t.Errorf("DefaultSource(%+v) = %q, want %q", c.env.Origin, got, c.want)
		}
	}
}
