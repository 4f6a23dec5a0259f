package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultAMQPURL is the RabbitMQ the tests use when $AMQP_URL is not set.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// AMQPURL returns $AMQP_URL, or DefaultAMQPURL, after checking that a
// connection opens.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("AMQP_URL")
	if u == "" {
		u = DefaultAMQPURL
	}
	// Another test package may be in its broker-down scenario (StopRabbitMQ)
	// right now: wait out a bounded outage before giving up.
	deadline := time.Now().Add(90 * time.Second)
	for {
		conn, err := amqp.Dial(u)
		if err == nil {
			conn.Close()
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("RabbitMQ at %s: %v (start it, or set $AMQP_URL)", redactURL(u), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// RabbitMQControllable reports whether the tests can stop and start the
// RabbitMQ at url: it runs on this machine and rabbitmqctl is installed.
func RabbitMQControllable(u string) bool {
	pu, err := url.Parse(u)
	if err != nil {
		return false
	}
	if h := pu.Hostname(); h != "127.0.0.1" && h != "localhost" && h != "::1" {
		return false
	}
	_, err = exec.LookPath("rabbitmqctl")
	return err == nil
}

// RabbitMQCtl runs rabbitmqctl with args and returns its output, failing
// t on an error. While another test binary has the machine's broker
// stopped (StopRabbitMQ: packages run at once), the command is refused
// because the app is not running; it is tried again until the broker is
// back, for up to two minutes.
func RabbitMQCtl(t testing.TB, args ...string) []byte {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
		if err == nil {
			return out
		}
		if !strings.Contains(string(out), "app to be running") || time.Now().After(deadline) {
			t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// StopRabbitMQ stops the RabbitMQ application on this machine (`rabbitmqctl
// stop_app`; the Erlang node stays up, durable queues and persistent
// messages survive). The returned start brings it back and waits until url
// accepts connections; it also runs when the test ends, whatever happened,
// so a failing test never leaves the machine's broker down.
func StopRabbitMQ(t testing.TB, u string) (start func(testing.TB)) {
	t.Helper()
	var once sync.Once
	start = func(tb testing.TB) {
		once.Do(func() {
			if out, err := exec.Command("rabbitmqctl", "start_app").CombinedOutput(); err != nil {
				tb.Errorf("rabbitmqctl start_app: %v\n%s", err, out)
			}
			Eventually(tb, time.Minute, "RabbitMQ accepting connections", func() bool {
				conn, err := amqp.Dial(u)
				if err != nil {
					return false
				}
				conn.Close()
				return true
			})
		})
	}
	t.Cleanup(func() { start(t) })
	// Cleanups do not run when the test binary dies (a -timeout panic, a
	// kill): a detached watchdog starts the broker once this process is
	// gone. When the test restored it already, start_app does nothing.
	watchdog := exec.Command("sh", "-c", fmt.Sprintf(
		"while kill -0 %d 2>/dev/null; do sleep 1; done; rabbitmqctl start_app >/dev/null 2>&1", os.Getpid()))
	watchdog.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := watchdog.Start(); err != nil {
		t.Fatalf("start the RabbitMQ watchdog: %v", err)
	}
	go func() { _ = watchdog.Wait() }()
	if out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl stop_app: %v\n%s", err, out)
	}
	return start
}

// AMQPCollector consumes a durable queue bound to an exchange and keeps
// every delivery, reconnecting when the broker goes away. Tests assert on
// what it holds: what RabbitMQ routed and stored.
type AMQPCollector struct {
	url, exchange, queue string

	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	msgs []amqp.Delivery
	seen map[string]bool // message ids appended, to drop the broker's redeliveries
}

// CollectAMQP declares exchange (a durable topic exchange, if missing) and a
// durable queue bound to it with keys, and starts consuming. The queue and
// exchange are deleted when the test ends.
func CollectAMQP(t testing.TB, u, exchange string, keys ...string) *AMQPCollector {
	t.Helper()
	c := &AMQPCollector{url: u, exchange: exchange, queue: Name("ferry_q"), done: make(chan struct{}), seen: map[string]bool{}}
	err := withChannel(u, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(c.queue, true, false, false, false, nil); err != nil {
			return err
		}
		for _, k := range keys {
			if err := ch.QueueBind(c.queue, k, exchange, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up queue %s on exchange %s: %v", c.queue, exchange, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	t.Cleanup(func() {
		cancel()
		<-c.done
		_ = withChannel(u, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(c.queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
			return err
		})
	})
	return c
}

// Bind adds a binding of key to the collector's queue.
func (c *AMQPCollector) Bind(t testing.TB, key string) {
	t.Helper()
	if err := withChannel(c.url, func(ch *amqp.Channel) error { return ch.QueueBind(c.queue, key, c.exchange, false, nil) }); err != nil {
		t.Fatalf("bind %s: %v", key, err)
	}
}

// Queue is the collector's queue name.
func (c *AMQPCollector) Queue() string { return c.queue }

// All returns a copy of what was delivered so far, in queue order.
func (c *AMQPCollector) All() []amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]amqp.Delivery(nil), c.msgs...)
}

// Len is the number of deliveries so far.
func (c *AMQPCollector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func (c *AMQPCollector) run(ctx context.Context) {
	defer close(c.done)
	for ctx.Err() == nil {
		c.consume(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consume reads until the connection drops or ctx ends. A message is added
// before it is acked, so none is lost between the two; when the connection
// drops between the two, RabbitMQ delivers it again, flagged redelivered, and
// that copy is skipped: it is the reader's duplicate, not the publisher's
// (a publisher's re-send arrives as a new, unflagged message).
func (c *AMQPCollector) consume(ctx context.Context) {
	conn, err := amqp.Dial(c.url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		return
	}
	deliveries, err := ch.Consume(c.queue, "", false, false, false, false, nil)
	if err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			c.mu.Lock()
			if !d.Redelivered || !c.seen[d.MessageId] {
				c.msgs = append(c.msgs, d)
				c.seen[d.MessageId] = true
			}
			c.mu.Unlock()
			_ = d.Ack(false)
		}
	}
}

func withChannel(u string, fn func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(u)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return fn(ch)
}
