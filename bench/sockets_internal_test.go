package bench

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// The process's established connections to a port are counted, those to
// other ports are not.
func TestBrokerConnectionsCountsEstablishedToThePorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	n, err := brokerConnections(os.Getpid(), map[int]bool{port: true})
	if err != nil {
		t.Fatal(err)
	}
	// The accepted ends are this process's too, but their remote port is
	// the dialler's, not the listener's.
	if n != 3 {
		t.Fatalf("%d connections to port %d, want 3", n, port)
	}
	if n, _ := brokerConnections(os.Getpid(), map[int]bool{port + 1: true}); n != 0 {
		t.Fatalf("%d connections to a port nobody dialled", n)
	}
}

func TestBrokerPorts(t *testing.T) {
	for _, c := range []struct {
		config map[string]any
		want   []int
	}{
		{map[string]any{"url": "nats://127.0.0.1:4222"}, []int{4222}},
		{map[string]any{"url": "nats://a:4222, nats://b:4223"}, []int{4222, 4223}},
		{map[string]any{"url": "amqp://guest:guest@127.0.0.1:5672/"}, []int{5672}},
		{map[string]any{"brokers": []string{"127.0.0.1:9092", "127.0.0.1:9093"}}, []int{9092, 9093}},
	} {
		got := (&target{config: c.config}).brokerPorts()
		if len(got) != len(c.want) {
			t.Errorf("%v: ports %v, want %v", c.config, got, c.want)
		}
		for _, p := range c.want {
			if !got[p] {
				t.Errorf("%v: ports %v lack %s", c.config, got, strconv.Itoa(p))
			}
		}
	}
}
