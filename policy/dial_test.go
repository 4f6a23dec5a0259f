package policy_test

import (
	"testing"

	"github.com/ferryhq/ferry/policy"
)

func TestAllowsBroker(t *testing.T) {
	pol := policy.Policy{Brokers: []string{"localhost:4222", "Kafka-1.example.com:9092", "[::1]:5672"}}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"localhost:4222", true},
		{"127.0.0.1:4222", true},
		{"[::1]:4222", true},
		{"kafka-1.example.com:9092", true},
		{"127.0.0.1:5672", true},
		{"127.0.0.1:18651", false},
		{"kafka-2.example.com:9092", false},
		{"kafka-1.example.com:9093", false},
		{"10.0.0.1:4222", false},
		{"localhost", false},
		{"", false},
	} {
		if got := pol.AllowsBroker(tc.addr); got != tc.want {
			t.Errorf("AllowsBroker(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
	if (policy.Policy{}).AllowsBroker("localhost:4222") {
		t.Error("the zero policy allows a broker")
	}
}
