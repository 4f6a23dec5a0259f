package relaytest

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// ThroughNATS is a plugintest.Through over a NATS JetStream server of the
// scenario's own: the pipelines deliver with the nats sink, a stream
// collects what arrives (duplicate window 100ms, so the relay's re-sends
// stay countable), and Down and Up stop and restart the server on the same
// port with the same store.
func ThroughNATS(t testing.TB) *plugintest.Through {
	t.Helper()
	srv, err := natsserver.Start(0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	port, store, url := srv.Port(), srv.StoreDir(), srv.URL()
	name := testenv.Name("t")
	subject := "ferry.test." + name
	coll := testenv.CollectStream(t, url, "S_"+name, 100*time.Millisecond, subject)
	return &plugintest.Through{
		SinkYAML: "sink:\n  type: nats\n  url: " + url + "\n  subject: " + subject + "\n",
		Received: func() []plugintest.Recorded {
			msgs := coll.All()
			out := make([]plugintest.Recorded, 0, len(msgs))
			for _, m := range msgs {
				md := map[string]string{}
				for k, v := range m.Header {
					if len(v) > 0 {
						md[k] = v[0]
					}
				}
				out = append(out, plugintest.Recorded{Topic: m.Subject, UUID: testenv.EventID(m.Header), Payload: m.Data, Metadata: md, At: m.At})
			}
			return out
		},
		Down: func(testing.TB) {
			srv.Shutdown()
			srv.WaitForShutdown()
		},
		Up: func(t testing.TB) {
			if srv, err = natsserver.Start(port, store); err != nil {
				t.Fatal(err)
			}
		},
	}
}
