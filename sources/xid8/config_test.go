package xid8_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
)

// The supervisor finds metrics_interval through plugins.HealthIntervaler,
// on the config as the loader decodes it.
func TestHealthInterval(t *testing.T) {
	for yaml, want := range map[string]time.Duration{"": 15 * time.Second, "  metrics_interval: 2s\n": 2 * time.Second} {
		doc := "name: p\nsource:\n  type: xid8\n  dsn: postgres://db/orders\n" + yaml + "sink:\n  type: " + plugintest.RecorderName + "\n  path: /tmp/unused\n"
		specs, err := pipelines.Loader{Registry: plugintest.Registry()}.LoadBytes("p.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		hi, ok := specs[0].Source.Config.(plugins.HealthIntervaler)
		if !ok || hi.HealthInterval() != want {
			t.Errorf("source section %q: HealthIntervaler %v, want %s", yaml, hi, want)
		}
	}
}
