package xid8_test

import (
	"testing"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// The suite again, delivering through the nats sink to a JetStream server
// instead of the recorder: what a harness's Through does, with a broker's
// metadata-as-headers and an outage that stops the server.
func TestConformanceThroughNATS(t *testing.T) {
	h := harness
	h.Through = relaytest.ThroughNATS
	plugintest.RunSource(t, h)
}
