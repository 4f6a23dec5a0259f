package nats_test

import (
	"strings"
	"testing"

	"github.com/ferryhq/ferry/plugins"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

// A control character is refused in a subject by Ferry itself (a CR/LF
// would end the protocol line and start another command), and JetStream's
// API and the system account's subjects for every pipeline, the admin's
// included: a message there is a command to the server. $KV. stays the
// admin's (it is how a key-value bucket is written); the tenant policy
// refuses it to tenants.
func TestValidateNames(t *testing.T) {
	for _, c := range []struct {
		name string
		mut  func(*natssink.Config)
		want []string
	}{
		{"CR LF in the subject", func(c *natssink.Config) { c.Subject = "orders.x\r\nPUB team-a.orders 2" }, []string{
			"subject: has a control character (byte 0x0d at 8): a CR or LF would end the protocol line it is sent on"}},
		{"DEL in the subject", func(c *natssink.Config) { c.Subject = "orders.\x7f" }, []string{"subject: has a control character (byte 0x7f at 7)"}},
		{"JetStream's API", func(c *natssink.Config) { c.Subject = "$JS.API.STREAM.DELETE.ORDERS" }, []string{
			`subject: "$JS.API.STREAM.DELETE.ORDERS" is JetStream's API: no pipeline may publish to it`}},
		{"the system account", func(c *natssink.Config) { c.Subject = "$SYS.REQ.SERVER.PING" }, []string{`subject: "$SYS.REQ.SERVER.PING" is the system account's`}},
		{"a stream capturing JetStream's API", func(c *natssink.Config) {
			c.CreateStream = &natssink.StreamConfig{Name: "S", Subjects: []string{"orders.>", "$JS.API.>"}}
		}, []string{`create_stream.subjects[1]: "$JS.API.>" is JetStream's API: no stream may capture it`}},
		{"LF in a stream subject", func(c *natssink.Config) {
			c.CreateStream = &natssink.StreamConfig{Name: "S", Subjects: []string{"orders\n.>"}}
		}, []string{"create_stream.subjects[0]: has a control character"}},
		{"the admin's key-value bucket", func(c *natssink.Config) { c.Subject = "$KV.config.orders" }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := natssink.DefaultConfig()
			cfg.Subject = "orders.x"
			c.mut(cfg)
			var got []string
			for _, err := range plugins.Flatten(cfg.Validate()) {
				got = append(got, err.Error())
			}
			if len(got) != len(c.want) {
				t.Fatalf("Validate() = %q, want %q", got, c.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], c.want[i]) {
					t.Errorf("Validate() = %q, want %q", got, c.want)
				}
			}
		})
	}
}
