package canary

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/pipelines"
)

// A canary read back is recognised in every sink format: raw, the data of
// a structured CloudEvent, the payload of Ferry's envelope.
func TestArrivedInEveryFormat(t *testing.T) {
	p, _ := json.Marshal(payload{CanaryID: "c1", Pipeline: "orders", GeneratedAt: time.Now().Add(-time.Second)})
	for name, body := range map[string]string{
		"raw":        string(p),
		"structured": fmt.Sprintf(`{"specversion":"1.0","id":"x","source":"/s","type":"FerryCanary","data":%s}`, p),
		"envelope":   fmt.Sprintf(`{"envelope_version":1,"event_id":"x","payload":%s}`, p),
	} {
		c := New(pipelines.DefaultCanary(), Deps{Pipeline: "orders"})
		c.arrived(message.NewMessage("x", []byte(body)))
		c.mu.Lock()
		seen := c.lastSeen
		c.mu.Unlock()
		if seen.IsZero() {
			t.Errorf("%s: canary not recognised in %s", name, body)
		}
	}
	c := New(pipelines.DefaultCanary(), Deps{Pipeline: "orders"})
	c.arrived(message.NewMessage("x", []byte(`{"data":{"n":1}}`)))
	if !c.lastSeen.IsZero() {
		t.Error("a non-canary counted as a canary")
	}
}
