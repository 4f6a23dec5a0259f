package rabbitmq

import (
	"strings"
	"testing"
)

// A routing key rendered per event from the row's metadata is seen by no
// other check: a value with a control character fails the event (a
// permanent no_route at publish) instead of reaching the broker.
func TestRenderRefusesControlCharacters(t *testing.T) {
	tpl, err := parseTemplate("orders.${aggregate_type}")
	if err != nil {
		t.Fatal(err)
	}
	if key, err := tpl.render(map[string]string{"aggregate_type": "placed"}); err != nil || key != "orders.placed" {
		t.Fatalf("render = %q, %v", key, err)
	}
	key, err := tpl.render(map[string]string{"aggregate_type": "placed\r\nx"})
	if err == nil || !strings.Contains(err.Error(), `routing_key: the message's "aggregate_type" metadata has a control character`) {
		t.Errorf("render = %q, %v: want the control character refused", key, err)
	}
}
