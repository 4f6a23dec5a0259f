package redact_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/examples/redact"
	natssink "github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sources/xid8"
)

func TestRedact(t *testing.T) {
	cases := []struct{ fields, in, out, reason string }{
		{"email", `{"email":"a@b.c","total":3}`, `{"email":"[redacted]","total":3}`, ""},
		{"customer.email,customer.phone", `{"customer":{"email":"a@b.c","phone":"1","name":"Ann"}}`,
			`{"customer":{"email":"[redacted]","name":"Ann","phone":"[redacted]"}}`, ""},
		{"customer.email", `{"customer":"Ann"}`, `{"customer":"Ann"}`, ""},
		{"email", `{"total":3}`, `{"total":3}`, ""},
		{"email", `[1,2]`, "", "undecodable_payload"},
	}
	for _, c := range cases {
		cfg := redact.DefaultConfig()
		cfg.Fields = strings.Split(c.fields, ",")
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		out, err := redact.New(cfg).Process(message.NewMessage("ev", []byte(c.in)))
		if c.reason != "" {
			if r, ok := plugins.IsPermanent(err); !ok || r != c.reason {
				t.Errorf("%s: err %v, want %s", c.in, err, c.reason)
			}
			continue
		}
		if err != nil || string(out[0].Payload) != c.out {
			t.Errorf("%s → %s (%v), want %s", c.in, out[0].Payload, err, c.out)
		}
	}
	bad := redact.DefaultConfig()
	bad.Fields = []string{"a..b"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `fields[0]: "a..b"`) {
		t.Errorf("Validate() = %v", err)
	}
}

// A platform team's transform, loaded from pipeline YAML like Ferry's own.
func Example() {
	reg := plugins.NewRegistry()
	xid8.Register(reg)
	natssink.Register(reg)
	redact.Register(reg)

	specs, err := pipelines.Loader{Registry: reg}.LoadBytes("customers.yaml", []byte(`
name: customers
source: {type: xid8, dsn: "postgres://ferry@db/app"}
transforms:
  - type: redact
    fields: [customer.email]
sink: {type: nats, subject: customers}
`))
	if err != nil {
		panic(err)
	}
	t := specs[0].Transforms[0]
	tr, _ := t.Factory.BuildTransform(t.Config, plugins.Env{})
	out, _ := tr.Process(message.NewMessage("ev-1",
		[]byte(`{"customer":{"email":"ann@example.com","name":"Ann"}}`)))
	fmt.Println(specs[0].Describe())
	fmt.Println(string(out[0].Payload))
	// Output:
	// customers (xid8 → redact → nats)
	// {"customer":{"email":"[redacted]","name":"Ann"}}
}
