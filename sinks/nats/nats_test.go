package nats_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/plugins/plugintest"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// natsTarget is one test's stream on $NATS_URL or on a fresh in-process
// JetStream server with a fixed port and store directory, which the
// broker-down test shuts down and starts again (streams and messages
// survive, as on a restarted server).
func natsTarget(t testing.TB) *plugintest.Target {
	url := os.Getenv("NATS_URL")
	var srv *natsserver.Server
	if url == "" {
		var err error
		if srv, err = natsserver.Start(0, t.TempDir()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		url = srv.URL()
	}
	base := strings.ReplaceAll(testenv.Name("ferry"), "_", "-")
	stream := strings.ToUpper(strings.ReplaceAll(base, "-", "_"))
	tg := &plugintest.Target{Default: base + ".default", Routed: base + ".routed"}
	tg.SinkYAML = func(dest string) string {
		return fmt.Sprintf("url: %s\nsubject: %s\ncreate_stream: {name: %s, subjects: [\"%s.>\"]}\n", url, dest, stream, base)
	}
	r := &streamReader{url: url, stream: stream, next: 1}
	t.Cleanup(r.close)
	tg.Received = r.read
	if srv != nil {
		tg.Stop = func(t testing.TB) func(testing.TB) {
			port, dir := srv.Port(), srv.StoreDir()
			srv.Close()
			return func(t testing.TB) {
				var err error
				testenv.Eventually(t, 60*time.Second, "NATS restarted on its port", func() bool {
					srv, err = natsserver.Start(port, dir)
					return err == nil
				})
			}
		}
	}
	return tg
}

// streamReader reads a stream incrementally, from the sequence after the
// last one read, with a fresh ordered consumer per call: it survives server
// restarts and never misses or repeats a stored message.
type streamReader struct {
	url, stream string

	mu   sync.Mutex
	nc   *nats.Conn
	recs []plugintest.Record
	next uint64
}

func (r *streamReader) read() []plugintest.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nc == nil {
		nc, err := nats.Connect(r.url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			return append([]plugintest.Record(nil), r.recs...)
		}
		r.nc = nc
	}
	js, _ := jetstream.New(r.nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		s, err := js.Stream(ctx, r.stream)
		if err != nil {
			break
		}
		info, err := s.Info(ctx)
		if err != nil || info.State.LastSeq < r.next {
			break
		}
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: r.next})
		if err != nil {
			break
		}
		batch, err := c.Fetch(int(min(info.State.LastSeq-r.next+1, 2000)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			break
		}
		got := 0
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			h := map[string]string{}
			for k := range m.Headers() {
				h[k] = m.Headers().Get(k)
			}
			r.recs = append(r.recs, plugintest.Record{Destination: m.Subject(), Stream: r.stream, ID: testenv.EventID(m.Headers()), Payload: m.Data(), Headers: h})
			r.next = meta.Sequence.Stream + 1
			got++
		}
		if got == 0 {
			break
		}
	}
	return append([]plugintest.Record(nil), r.recs...)
}

func (r *streamReader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nc != nil {
		r.nc.Close()
	}
}

var harness = plugintest.SinkHarness{
	Type:     natssink.Name,
	Features: plugintest.SinkFeatures{DedupsResends: true},
	Target:   natsTarget,
}

// TestContract runs the contract tier on $NATS_URL or on an in-process
// JetStream server with a fixed port and store directory, which the
// broker-down scenario shuts down and starts again. Each topic is a
// subject with a stream of its own, which Read creates.
func TestContract(t *testing.T) {
	url := os.Getenv("NATS_URL")
	var srv *natsserver.Server
	if url == "" {
		var err error
		if srv, err = natsserver.Start(0, t.TempDir()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		url = srv.URL()
	}
	c := plugintest.SinkContract{
		New: func(t testing.TB, topic string) plugins.Sink {
			cfg := natssink.DefaultConfig()
			cfg.URL, cfg.Subject, cfg.PublishTimeout = url, topic, 2*time.Second
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s := natssink.New(cfg, plugins.Env{Pipeline: "contract", Logger: plugintest.Logger()})
			t.Cleanup(func() { s.Close() })
			return s
		},
		Read: func(t testing.TB, topic string) <-chan plugintest.Record {
			stream := strings.ToUpper(topic)
			createStream(t, url, jetstream.StreamConfig{Name: stream, Subjects: []string{topic}})
			r := &streamReader{url: url, stream: stream, next: 1}
			t.Cleanup(r.close)
			return plugintest.Poll(t, r.read)
		},
		Features: plugintest.SinkFeatures{DedupsResends: true},
		Timeout:  2 * time.Second,
		// Over the server's max_payload (1 MiB by default): the client
		// refuses to send it.
		Refuse: func(m *message.Message) string { m.Payload = make([]byte, 2<<20); return "oversize" },
	}
	if srv != nil {
		c.Stop = func(t testing.TB) func(testing.TB) {
			port, dir := srv.Port(), srv.StoreDir()
			srv.Close()
			return func(t testing.TB) {
				var err error
				testenv.Eventually(t, 60*time.Second, "NATS restarted on its port", func() bool {
					srv, err = natsserver.Start(port, dir)
					return err == nil
				})
			}
		}
	}
	plugintest.RunSinkContract(t, c)
}

// createStream creates (or updates) a stream on the server at url; it is
// deleted when the test ends.
func createStream(t testing.TB, url string, cfg jetstream.StreamConfig) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := testenv.CreateStream(ctx, js, cfg); err != nil {
		t.Fatalf("create stream %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() {
		nc, err := nats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Name)
	})
}

func TestPipeline(t *testing.T) { plugintest.RunSinkPipeline(t, harness) }

// BenchmarkDrain50k measures the drain rate from an xid8 outbox holding
// 50,000 events into NATS JetStream ($NATS_URL or an in-process server).
func BenchmarkDrain50k(b *testing.B) { plugintest.BenchmarkSinkDrain(b, harness, 50000) }

// startServer runs an in-process JetStream server with extra options (TLS,
// auth) on a free port.
func startServer(t *testing.T, mut func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	mut(opts)
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// publishOne starts a sink and publishes one event to a stream it creates.
func publishOne(t *testing.T, cfg *natssink.Config) error {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: "test", Logger: plugintest.Logger()})
	defer s.Close()
	if err := s.Start(context.Background()); err != nil {
		return err
	}
	return s.Publish("", message.NewMessage("secure-1", []byte("x")))
}

func secureConfig(url string) *natssink.Config {
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject = url, "ferry.secure"
	cfg.CreateStream = &natssink.StreamConfig{Name: "SECURE"}
	return cfg
}

// TLS: the sink verifies the server with ca_file and presents a client
// certificate the server requires; without them it cannot publish.
func TestTLS(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	tc := files.ServerConfig()
	tc.ClientAuth = tls.RequireAndVerifyClientCert
	ns := startServer(t, func(o *server.Options) { o.TLSConfig, o.TLS, o.TLSVerify = tc, true, true })
	cfg := secureConfig(ns.ClientURL())
	cfg.TLS = natssink.TLSConfig{Enabled: true, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key}
	if err := publishOne(t, cfg); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(t, secureConfig(ns.ClientURL())); err == nil {
		t.Fatal("published to a TLS server without TLS")
	}
}

// user/password and token, as fields; wrong ones fail, and stay out of errors.
func TestUserPasswordAndToken(t *testing.T) {
	up := startServer(t, func(o *server.Options) { o.Username, o.Password = "ferry", "s3cret" })
	cfg := secureConfig(up.ClientURL())
	cfg.User, cfg.Password = "ferry", "s3cret"
	if err := publishOne(t, cfg); err != nil {
		t.Fatal(err)
	}
	cfg = secureConfig(up.ClientURL())
	cfg.User, cfg.Password = "ferry", "hunter2"
	if err := publishOne(t, cfg); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("wrong password: %v", err)
	}

	tok := startServer(t, func(o *server.Options) { o.Authorization = "t0ken" })
	cfg = secureConfig(tok.ClientURL())
	cfg.Token = "t0ken"
	if err := publishOne(t, cfg); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(t, secureConfig(tok.ClientURL())); err == nil {
		t.Fatal("published without the token")
	}
}

// credentials_file: a .creds file (user JWT and seed) against a server in
// operator mode.
func TestCredentialsFile(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	sysKP, _ := nkeys.CreateAccount()
	sysPub, _ := sysKP.PublicKey()
	oc.SystemAccount = sysPub
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt, err := ac.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "ferry.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	_ = resolver.Store(sysPub, sysJWT)
	_ = resolver.Store(apub, ajwt)
	ns := startServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{oc}
		o.AccountResolver = resolver
		o.SystemAccount = sysPub
	})
	cfg := secureConfig(ns.ClientURL())
	cfg.CredentialsFile = credsFile
	if err := publishOne(t, cfg); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(t, secureConfig(ns.ClientURL())); err == nil {
		t.Fatal("published without credentials")
	}
}

// Stream options reach the stream.
func TestStreamOptions(t *testing.T) {
	url := testenv.NATS(t)
	name := strings.ToUpper(testenv.Name("opts"))
	s := newSink(t, url, "ferry.opts."+strings.ToLower(name), &natssink.StreamConfig{
		Name: name, Storage: "memory", Retention: "workqueue", Discard: "new", MaxMsgs: 10, MaxBytes: 1 << 20, MaxMsgSize: 1024, DuplicateWindow: time.Minute,
	})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	c := st.CachedInfo().Config
	if c.Storage != jetstream.MemoryStorage || c.Retention != jetstream.WorkQueuePolicy || c.Discard != jetstream.DiscardNew ||
		c.MaxMsgs != 10 || c.MaxBytes != 1<<20 || c.MaxMsgSize != 1024 || c.Duplicates != time.Minute {
		t.Fatalf("stream config %+v", c)
	}
	// A message over max_msg_size is refused by the stream: the publish
	// fails for good, so the pipeline dead-letters it as oversize.
	err = s.Publish("", message.NewMessage("big", make([]byte, 2048)))
	if reason, ok := plugins.IsPermanent(err); !ok || reason != "oversize" {
		t.Fatalf("publish over the stream's max_msg_size: %v (permanent %q %v), want a permanent oversize error", err, reason, ok)
	}
}

func newSink(t *testing.T, url, subject string, stream *natssink.StreamConfig) *natssink.Sink {
	t.Helper()
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject, cfg.CreateStream = url, subject, stream
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: "test"})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPublishStoresPayloadHeadersAndID(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("s")
	subject := "ferry.sink." + name
	s := newSink(t, url, subject+".default", &natssink.StreamConfig{Name: strings.ToUpper(name), Subjects: []string{subject + ".>"}})
	if err := s.Publish("", message.NewMessage("x", nil)); err == nil {
		t.Fatal("publish before Start succeeded")
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m1 := message.NewMessage("0b5c1f9e-0000-4000-8000-000000000001", []byte(`{"n":1}`))
	m1.Metadata.Set(plugins.MetaAggregateID, "order-1")
	m1.Metadata.Set("traceparent", "00-abc-def-01")
	m2 := message.NewMessage("0b5c1f9e-0000-4000-8000-000000000002", []byte(`{"n":2}`))
	m2.Metadata.Set(plugins.MetaTopic, subject+".routed")
	if err := s.Publish("", m1); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(m2.Metadata.Get(plugins.MetaTopic), m2); err != nil {
		t.Fatal(err)
	}
	msgs := read(t, url, strings.ToUpper(name), 2)
	if msgs[0].Subject() != subject+".default" || msgs[1].Subject() != subject+".routed" {
		t.Errorf("subjects %s, %s", msgs[0].Subject(), msgs[1].Subject())
	}
	h := msgs[0].Headers()
	switch {
	case string(msgs[0].Data()) != `{"n":1}`:
		t.Errorf("payload %s", msgs[0].Data())
	case h.Get(nats.MsgIdHdr) != m1.UUID:
		t.Errorf("Nats-Msg-Id %q, want the event id", h.Get(nats.MsgIdHdr))
	case h.Get(plugins.MetaAggregateID) != "order-1" || h.Get("traceparent") != "00-abc-def-01":
		t.Errorf("headers %v", h)
	case msgs[1].Headers().Get(plugins.MetaTopic) != "":
		t.Errorf("routing metadata leaked into headers: %v", msgs[1].Headers())
	}
}

// A re-send of an event id the stream holds is dropped, confirmed and
// counted as a duplicate; a re-send asked for is stored once per request.
func TestResentIDIsDeduplicated(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("d")
	s := newSink(t, url, "ferry.dedup."+name, &natssink.StreamConfig{Name: strings.ToUpper(name)})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Publish("", message.NewMessage("same-event", []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Publish("", message.NewMessage("other-event", []byte("y"))); err != nil {
		t.Fatal(err)
	}
	if n := streamMsgs(t, url, strings.ToUpper(name)); n != 2 {
		t.Fatalf("stream holds %d messages, want 2 (re-sends dropped by Nats-Msg-Id)", n)
	}
	// The two dropped are confirmed, and counted as what they are.
	if d := s.Duplicates(); d != 2 {
		t.Errorf("Duplicates() = %d, want the 2 the stream dropped", d)
	}
	// A re-send asked for names its request in Nats-Msg-Id: stored, once
	// per request, however often that request's copy is sent.
	for _, req := range []string{"backfill-1", "backfill-1", "backfill-2"} {
		m := message.NewMessage("same-event", []byte("x"))
		m.Metadata.Set(plugins.MetaResend, req)
		if err := s.PublishBatch("", []*message.Message{m, message.NewMessage("other-event", []byte("y"))})[0]; err != nil {
			t.Fatal(err)
		}
	}
	if n := streamMsgs(t, url, strings.ToUpper(name)); n != 4 {
		t.Fatalf("stream holds %d messages, want 4 (the event, another, and two requests' re-sends)", n)
	}
	ids := streamIDs(t, url, strings.ToUpper(name), 4)
	if ids["same-event:backfill-1"] != 1 || ids["same-event:backfill-2"] != 1 {
		t.Errorf("Nats-Msg-Ids in the stream: %v", ids)
	}
	if d := s.Duplicates(); d != 2+1+3 {
		t.Errorf("Duplicates() = %d, want 6 (two before, backfill-1's second copy, three other-event)", d)
	}
}

func TestConcurrentPublishes(t *testing.T) {
	url := testenv.NATS(t)
	name := testenv.Name("c")
	s := newSink(t, url, "ferry.conc."+name, &natssink.StreamConfig{Name: strings.ToUpper(name)})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2000)
	for i := range 2000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Publish("", message.NewMessage(fmt.Sprintf("ev-%d", i), []byte("x")))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := streamMsgs(t, url, strings.ToUpper(name)); n != 2000 {
		t.Fatalf("stream holds %d, want 2000", n)
	}
}

func TestBrokerDownFailsPublish(t *testing.T) {
	srv, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, srv.URL(), "ferry.down", &natssink.StreamConfig{Name: "DOWN"})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish("", message.NewMessage("a", nil)); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := s.Publish("", message.NewMessage("b", nil)); err == nil {
		t.Fatal("publish succeeded with the broker down")
	}
	batch := []*message.Message{message.NewMessage("c", nil), message.NewMessage("d", nil), message.NewMessage("e", nil)}
	errs := s.PublishBatch("", batch)
	if len(errs) != len(batch) {
		t.Fatalf("%d outcomes for a batch of %d", len(errs), len(batch))
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("batch message %d published with the broker down", i)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		mut  func(*natssink.Config)
		want string
	}{
		{func(c *natssink.Config) { c.Subject = "" }, "subject: must not be empty"},
		{func(c *natssink.Config) { c.Subject = "a b" }, `subject: "a b" is not a NATS subject`},
		{func(c *natssink.Config) { c.Subject = "a.*" }, `is not a NATS subject`},
		{func(c *natssink.Config) { c.URL = "" }, "url: must not be empty"},
		{func(c *natssink.Config) { c.PublishTimeout = 0 }, "publish_timeout: must be positive"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "a.b"} }, "create_stream.name:"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "S", Storage: "disk"} }, "create_stream.storage: must be file or memory"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "S", Retention: "forever"} }, "create_stream.retention: must be limits, interest or workqueue"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "S", Discard: "oldest"} }, "create_stream.discard: must be old or new"},
		{func(c *natssink.Config) { c.CreateStream = &natssink.StreamConfig{Name: "S", MaxMsgs: -1} }, "create_stream.max_msgs: must not be negative"},
		{func(c *natssink.Config) { c.Token, c.User, c.Password = "t", "u", "p" }, "token: use either token or user and password"},
		{func(c *natssink.Config) { c.User = "u" }, "user: user and password go together"},
		{func(c *natssink.Config) { c.CredentialsFile = "/nonexistent.creds" }, "credentials_file: cannot read /nonexistent.creds"},
		{func(c *natssink.Config) { c.TLS = natssink.TLSConfig{Enabled: true, KeyFile: "k"} }, "tls.cert_file: cert_file and key_file go together"},
		{func(c *natssink.Config) { c.URL = "nats://u:hunter2@h:4222,:bad" }, "not a NATS URL"},
	}
	for _, c := range cases {
		cfg := natssink.DefaultConfig()
		cfg.Subject = "ok"
		c.mut(cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
	ok := natssink.DefaultConfig()
	ok.Subject = "outbox.orders"
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func read(t *testing.T, url, stream string, n int) []jetstream.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for m := range batch.Messages() {
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("read %d messages, want %d", len(out), n)
	}
	return out
}

func streamMsgs(t *testing.T, url, stream string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// batchSink starts a sink on a fresh stream of the server at url and
// returns it with the stream's name.
func batchSink(t testing.TB, url string, maxMsgSize int32) (*natssink.Sink, string) {
	t.Helper()
	name := strings.ToUpper(testenv.Name("b"))
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject = url, "ferry.batch."+strings.ToLower(name)
	cfg.CreateStream = &natssink.StreamConfig{Name: name, Storage: "memory", MaxMsgSize: maxMsgSize}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: "test", Logger: plugintest.Logger()})
	t.Cleanup(func() { s.Close() })
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if nc, err := nats.Connect(url); err == nil {
			js, _ := jetstream.New(nc)
			_ = js.DeleteStream(context.Background(), name)
			nc.Close()
		}
	})
	return s, name
}

func batchOf(prefix string, n, size int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("%s-%03d", prefix, i), make([]byte, size))
		msgs[i].Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("agg-%d", i))
		msgs[i].Metadata.Set(plugins.MetaEventType, "OrderPlaced")
	}
	return msgs
}

// streamIDs is the Nats-Msg-Id of every message the stream holds.
func streamIDs(t *testing.T, url, stream string, n int) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range read(t, url, stream, n) {
		ids[m.Headers().Get(nats.MsgIdHdr)]++
	}
	return ids
}

// A batch's messages are all stored, once, and each outcome is reported.
func TestPublishBatchStoresEvery(t *testing.T) {
	url := testenv.NATS(t)
	s, stream := batchSink(t, url, 0)
	msgs := batchOf("ev", 500, 64)
	errs := s.PublishBatch("", msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %s: %v", msgs[i].UUID, err)
		}
	}
	ids := streamIDs(t, url, stream, len(msgs))
	for _, m := range msgs {
		if ids[m.UUID] != 1 {
			t.Errorf("message %s stored %d times, want once", m.UUID, ids[m.UUID])
		}
	}
	if n := streamMsgs(t, url, stream); n != uint64(len(msgs)) {
		t.Errorf("the stream holds %d messages, want %d", n, len(msgs))
	}
}

// An oversize message in the middle of a batch fails alone, as a permanent
// oversize error, both when the client refuses it (over the server's
// max_payload) and when the stream does (over its max_msg_size); every
// other message of the batch is confirmed and stored.
func TestPublishBatchOversizeFailsAlone(t *testing.T) {
	url := testenv.NATS(t)
	for _, c := range []struct {
		name     string
		maxSize  int32
		bigBytes int
	}{
		{"over max_payload", 0, 2 << 20},
		{"over the stream's max_msg_size", 1024, 4096},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, stream := batchSink(t, url, c.maxSize)
			msgs := batchOf("mix", 20, 16)
			msgs[7].Payload = make([]byte, c.bigBytes)
			errs := s.PublishBatch("", msgs)
			if len(errs) != len(msgs) {
				t.Fatalf("%d outcomes for %d messages", len(errs), len(msgs))
			}
			for i, err := range errs {
				if i == 7 {
					if reason, ok := plugins.IsPermanent(err); !ok || reason != "oversize" {
						t.Errorf("oversize message: %v (permanent %q %v), want a permanent oversize error", err, reason, ok)
					}
					continue
				}
				if err != nil {
					t.Errorf("message %s failed with the oversize one: %v", msgs[i].UUID, err)
				}
			}
			ids := streamIDs(t, url, stream, len(msgs)-1)
			for i, m := range msgs {
				if want := map[bool]int{true: 0, false: 1}[i == 7]; ids[m.UUID] != want {
					t.Errorf("message %s stored %d times, want %d", m.UUID, ids[m.UUID], want)
				}
			}
			// Publish keeps its contract: the oversize message fails it.
			err := s.Publish("", msgs[7])
			if reason, ok := plugins.IsPermanent(err); !ok || reason != "oversize" {
				t.Errorf("Publish of the oversize message: %v, want a permanent oversize error", err)
			}
		})
	}
}

// benchEvents are 100-message batches shaped like an outbox event: a
// small JSON payload and a source's metadata.
func benchEvents(b *testing.B, batches int) [][]*message.Message {
	out := make([][]*message.Message, batches)
	for i := range out {
		out[i] = make([]*message.Message, 100)
		for j := range out[i] {
			m := message.NewMessage(fmt.Sprintf("bench-%d-%d-%d", b.N, i, j), []byte(`{"order_id":"o-1","total":"12.50","currency":"EUR"}`))
			m.Metadata.Set(plugins.MetaAggregateType, "order")
			m.Metadata.Set(plugins.MetaAggregateID, fmt.Sprintf("order-%d", j))
			m.Metadata.Set(plugins.MetaEventType, "OrderPlaced")
			m.Metadata.Set(plugins.MetaCreatedAt, "2026-05-04T10:11:12.123456Z")
			m.Metadata.Set(plugins.MetaOutboxID, fmt.Sprint(i*100+j))
			m.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			out[i][j] = m
		}
	}
	return out
}

// BenchmarkPublish: 100 events published by 100 concurrent Publish calls
// (a pipeline's window today), reported per event.
//
//	go test ./sinks/nats -run '^$' -bench 'Publish' -benchtime 200x
func BenchmarkPublish(b *testing.B) {
	s, _ := batchSink(b, testenv.NATS(b), 0)
	plugintest.BenchmarkPublish(b, s, benchEvents(b, b.N))
}

// BenchmarkPublishBatch: the same 100 events as one PublishBatch call.
func BenchmarkPublishBatch(b *testing.B) {
	s, _ := batchSink(b, testenv.NATS(b), 0)
	plugintest.BenchmarkPublishBatch(b, s, benchEvents(b, b.N))
}
