// Package nats is the NATS JetStream sink. A publish returns only after the
// stream's PubAck, so an event counts as delivered only once JetStream stored
// it. Each message carries Nats-Msg-Id = event id, and JetStream drops re-sends
// of an id within the stream's duplicate window (default 2m) — the re-sends an
// at-least-once relay makes after a crash. A re-send asked for (a backfill, a
// reset back, a dead-letter replay; plugins.MetaResend) carries
// "<event id>:<request>" instead, so the window does not drop it; the event id
// stays in Watermill's uuid header.
//
// A PubAck saying Duplicate (the stream kept nothing new: it holds a message
// with that Nats-Msg-Id from within its window) confirms the publish — the
// stream has the event — but is no delivery: the sink counts it
// (plugins.DuplicateCounter, ferry_sink_duplicates_total) and warns at most
// once a minute per pipeline, naming the stream. Its likely cause is another
// pipeline publishing the same event ids into the stream (one outbox table,
// several pipelines, subjects of one stream).
//
// The connection authenticates with user/password, a token or a .creds file
// and may use TLS. It has no reconnect buffer: while disconnected a publish
// fails at once, instead of being buffered, timing out here and reaching the
// stream later behind newer events. The pipelines of a process that name
// the same servers, credentials, TLS and ping interval share one
// connection (shared.go); each keeps its own JetStream context, so its
// pending acks, timeouts and failures stay its own.
//
// Publishes are JetStream asynchronous publishes: every concurrent Publish
// of the pipeline's in-flight window shares one reply subscription, and each
// waits only for its own PubAck. Not Watermill's NATS publisher: it sends a
// synchronous request per message through the legacy JetStream API and logs
// (a map of fields) per message, which `ferry bench` profiled as a third of
// the relay's CPU per event; the message format is the same (Watermill's
// uuid header, Nats-Msg-Id), so a Watermill NATS subscriber reads Ferry's
// messages as before.
//
// A sink imports plugins, sinks/format and the internal helpers (redact,
// tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/internal/brokerconn"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sinks/format"
)

// Name is the sink's registered type.
const Name = "nats"

// Register adds the NATS sink to r.
func Register(r *plugins.Registry) {
	plugins.RegisterSink(r, Name, DefaultConfig, func(c *Config, env plugins.Env) (plugins.Sink, error) {
		return New(c, env), nil
	})
}

func init() { Register(plugins.Default) }

// Sink publishes to NATS JetStream. Create with New.
type Sink struct {
	cfg *Config
	env plugins.Env
	log *slog.Logger
	enc *format.Encoder

	// sending is held for reading while a call sends (not while it awaits
	// its acks), so Close's CleanupPublisher never runs between a send's
	// check that the sink is open and its publish: that publish would open
	// the sink's reply subscription again on a connection others keep.
	sending sync.RWMutex

	mu     sync.Mutex
	lease  *brokerconn.Lease[*sharedConn] // the connection, shared (shared.go)
	shared *sharedConn
	conn   *nats.Conn          // shared.conn, for reading back and Ping
	js     jetstream.JetStream // the sink's own: its pending acks and timeout
	closed bool
	// dry is set by DryStart: the stream is looked up, never created or
	// changed, and what Start would do is noted (streams.go).
	dry   bool
	notes []string

	dups duplicates
}

// New returns a sink; it does no I/O until Start.
func New(cfg *Config, env plugins.Env) *Sink {
	if env.Logger == nil {
		env.Logger = slog.Default()
	}
	return &Sink{cfg: cfg, env: env, log: env.Logger.With("sink", Name), enc: format.New(cfg.Encoding, format.NATS, env)}
}

// Start takes a lease on the process's connection for the sink's servers
// and credentials (opening it if no pipeline did) and, if configured,
// creates the stream. The connection keeps reconnecting on its own; Start
// may be called again after an error.
func (s *Sink) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("nats sink: closed")
	}
	if s.env.Dial == nil {
		// A request acting for a tenant's pipeline (the API's connect
		// check) dials as the pipeline would.
		s.env.Dial = plugins.DialFrom(ctx)
	}
	if s.lease == nil {
		lease, err := conns.Acquire(ctx, brokerconn.Want{Key: s.cfg.connKey(dialScope(s.env.Dial, s.env.Tenant)), Endpoint: s.cfg.endpointLabel()},
			func() (*sharedConn, error) { return dial(s.cfg, s.env.Dial) })
		if err != nil {
			return err
		}
		shared := lease.Client()
		// The window bounds what is in flight; the client must not stall
		// below it. A PubAck that does not come within publish_timeout fails
		// its publish (and frees its slot). A context of its own per sink:
		// one pipeline's acks, timeouts and reply subscription are not
		// another's.
		js, err := jetstream.New(shared.conn, jetstream.WithPublishAsyncMaxPending(maxPendingAcks),
			jetstream.WithPublishAsyncTimeout(s.cfg.PublishTimeout))
		if err != nil {
			lease.Release()
			return fmt.Errorf("nats jetstream: %w", err)
		}
		shared.join(s)
		s.lease, s.shared, s.conn, s.js = lease, shared, shared.conn, js
	}
	if s.cfg.CreateStream != nil {
		return s.ensureStream(ctx)
	}
	return nil
}

// maxPendingAcks is how many publishes of one sink may await their PubAck:
// far above any max_in_flight, so only the pipeline's window limits it.
const maxPendingAcks = 1 << 20

// Publish sends messages to topic (the sink's subject when empty) and returns
// after JetStream acknowledged each. Safe for concurrent use: concurrent
// publishes share one connection and their acks are awaited in parallel.
func (s *Sink) Publish(topic string, msgs ...*message.Message) error {
	s.sending.RLock()
	js, conn, topic, err := s.publisher(topic)
	if err != nil {
		s.sending.RUnlock()
		return err
	}
	enc := getEncoder(msgs)
	var one [1]jetstream.PubAckFuture
	futures := one[:0]
	for _, msg := range msgs {
		// The messages of one call are in order (one aggregate's events):
		// the first that cannot be sent ends the call, so none after it
		// reaches the stream before it.
		f, err := s.send(js, conn, topic, enc, msg)
		if err != nil {
			s.sending.RUnlock()
			return err // enc is not reused: earlier messages' acks are not awaited
		}
		futures = append(futures, f)
	}
	s.sending.RUnlock()
	for i, f := range futures {
		if err := s.await(conn, topic, f); err != nil {
			if i == len(futures)-1 {
				enc.put()
			}
			return err
		}
	}
	enc.put()
	return nil
}

// PublishBatch sends msgs to topic (the sink's subject when empty) as
// asynchronous publishes, then waits for all their PubAcks at once: a batch
// costs one round trip, not one per message. errs[i] is msgs[i]'s outcome;
// a message that cannot be sent (over max_payload) fails alone and the
// others are still published. Safe for concurrent use.
func (s *Sink) PublishBatch(topic string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	s.sending.RLock()
	js, conn, topic, err := s.publisher(topic)
	if err != nil {
		s.sending.RUnlock()
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	enc := getEncoder(msgs)
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, msg := range msgs {
		futures[i], errs[i] = s.send(js, conn, topic, enc, msg)
		if errs[i] != nil && !conn.IsConnected() {
			// Disconnected, every later publish fails at once the same way
			// (there is no reconnect buffer): no need to explain each.
			for j := i + 1; j < len(msgs); j++ {
				errs[j] = errs[i]
			}
			break
		}
	}
	s.sending.RUnlock()
	for i, f := range futures {
		if f != nil {
			errs[i] = s.await(conn, topic, f)
		}
	}
	enc.put() // every ack arrived or failed
	return errs
}

// publisher is the started sink's JetStream context and connection, and
// the subject topic stands for.
func (s *Sink) publisher(topic string) (jetstream.JetStream, *nats.Conn, string, error) {
	s.mu.Lock()
	js, conn, closed := s.js, s.conn, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		// Its JetStream context would still publish on the shared
		// connection other sinks keep open.
		return nil, nil, "", errors.New("nats sink: closed")
	case js == nil:
		return nil, nil, "", errors.New("nats sink: not started")
	}
	if topic == "" {
		topic = s.cfg.Subject
	}
	return js, conn, topic, nil
}

// batchEncoder builds the NATS messages of one call: the messages and
// their header values come from two arrays, not two allocations per
// message, and the header maps are those of an earlier call, emptied.
// Encoders are reused (getEncoder, put) once every PubAck of their call
// arrived: nats.go serialises a message's headers when it publishes and
// keeps the message only to publish it again while its ack is awaited, so
// from then on nothing refers to them.
type batchEncoder struct {
	msgs  []nats.Msg
	base  []string // the values' array; vals is its unused rest
	vals  []string
	used  []nats.Header // the maps handed out in this call
	spare []nats.Header // emptied maps of earlier calls
	room  int           // the values this call may use of base
}

var encoders = sync.Pool{New: func() any { return new(batchEncoder) }}

// getEncoder is an encoder with room for msgs.
func getEncoder(msgs []*message.Message) *batchEncoder {
	b := encoders.Get().(*batchEncoder)
	n := 0
	for _, m := range msgs {
		n += len(m.Metadata) + 1
	}
	// Room for every message up front: each published *nats.Msg points
	// into this array, which must not move while they are in flight.
	if cap(b.msgs) < len(msgs) {
		b.msgs = make([]nats.Msg, 0, len(msgs))
	}
	if cap(b.base) < n {
		b.base = make([]string, n)
	}
	b.vals, b.room = b.base[:0], n
	return b
}

// put empties b for another call and keeps it. Call it only once every
// message it encoded was acked or failed.
func (b *batchEncoder) put() {
	// Only what this call used: the rest was emptied by the calls before,
	// and a one-message call must not clear a large batch's arrays.
	clear(b.msgs) // let go of the payloads
	b.msgs = b.msgs[:0]
	clear(b.base[:b.room])
	for _, h := range b.used {
		clear(h)
	}
	b.spare = append(b.spare, b.used...)
	clear(b.used)
	b.used = b.used[:0]
	encoders.Put(b)
}

// header is an empty header map for n headers.
func (b *batchEncoder) header(n int) nats.Header {
	var h nats.Header
	if k := len(b.spare); k > 0 {
		h, b.spare = b.spare[k-1], b.spare[:k-1]
	} else {
		h = make(nats.Header, n)
	}
	b.used = append(b.used, h)
	return h
}

// raw is natsMsg for the call's next message.
func (b *batchEncoder) raw(topic string, msg *message.Message) *nats.Msg {
	b.msgs = append(b.msgs, nats.Msg{})
	nm := &b.msgs[len(b.msgs)-1]
	b.vals = fillNatsMsg(nm, topic, msg, b.vals, b.header)
	return nm
}

// send encodes msg and publishes it asynchronously; the future resolves
// with its PubAck.
func (s *Sink) send(js jetstream.JetStream, conn *nats.Conn, topic string, enc *batchEncoder, msg *message.Message) (jetstream.PubAckFuture, error) {
	var nm *nats.Msg
	if s.enc.Raw(msg) {
		nm = enc.raw(topic, msg)
	} else {
		var err error
		if nm, err = encodedMsg(s.enc, topic, msg); err != nil {
			return nil, fmt.Errorf("encode %s: %w", msg.UUID, err)
		}
	}
	f, err := js.PublishMsgAsync(nm)
	if err != nil {
		return nil, classify(fmt.Errorf("publish to %s: %w", topic, s.rootCause(conn, err)))
	}
	return f, nil
}

// await waits until f's PubAck, an error reply, publish_timeout or a
// reconnect (which fails every pending publish).
func (s *Sink) await(conn *nats.Conn, topic string, f jetstream.PubAckFuture) error {
	select {
	case ack := <-f.Ok():
		if ack != nil && ack.Duplicate {
			s.dups.note(s.log, ack.Stream, topic)
		}
		return nil
	case err := <-f.Err():
		return classify(fmt.Errorf("publish to %s: %w", topic, s.rootCause(conn, err)))
	}
}

// Destination is the subject msg goes to: topic, else the sink's.
func (s *Sink) Destination(topic string, _ *message.Message) string {
	if topic == "" {
		return s.cfg.Subject
	}
	return topic
}

// classify marks the failures no retry can fix as permanent, so the
// pipeline dead-letters the message: over the server's max_payload, or over
// the stream's max_msg_size.
func classify(err error) error {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		return plugins.Permanent("oversize", err)
	}
	return err
}

// Close fails the sink's publishes still waiting for their PubAck, drops
// its reply subscription and lets go of the shared connection, which the
// last sink using it closes. Idempotent.
func (s *Sink) Close() error {
	s.sending.Lock()
	defer s.sending.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.lease != nil {
		s.shared.leave(s)
		s.js.CleanupPublisher()
		s.lease.Release()
	}
	return nil
}

// natsMsg writes the payload as the body and metadata as headers, leaving
// out Ferry's internal keys (plugins.IsInternal); the event id travels in
// Watermill's uuid header and, as plugins.BrokerMessageID makes it, as
// Nats-Msg-Id (JetStream's deduplication).
func natsMsg(topic string, msg *message.Message) *nats.Msg {
	nm := new(nats.Msg)
	fillNatsMsg(nm, topic, msg, nil, func(n int) nats.Header { return make(nats.Header, n) })
	return nm
}

// fillNatsMsg is natsMsg into nm, with the header values taken from vals'
// spare capacity (a batch's messages share one array) and what is left of
// it returned, and the header map from header. A new map is sized for the
// headers sent, not for the metadata: a message with internal keys often
// has more than a map's first group holds (8) yet sends fewer, and then
// needs one allocation, not a directory and table of four. The two id
// headers share one value unless the message is a requested re-send.
func fillNatsMsg(nm *nats.Msg, topic string, msg *message.Message, vals []string, header func(n int) nats.Header) []string {
	n := 1
	for k := range msg.Metadata {
		if !plugins.IsInternal(k) {
			n++
		}
	}
	if cap(vals)-len(vals) < n {
		vals = make([]string, 0, n)
	}
	h := header(n + 1)
	vals = append(vals, msg.UUID)
	id := vals[len(vals)-1 : len(vals) : len(vals)]
	h[wmnats.WatermillUUIDHdr] = id
	h[nats.MsgIdHdr] = id
	if msg.Metadata.Get(plugins.MetaResend) != "" {
		h[nats.MsgIdHdr] = []string{plugins.BrokerMessageID(msg)}
	}
	for k, v := range msg.Metadata {
		// No metadata may replace the id headers or steer JetStream
		// (Nats-Msg-Id naming another event would make the stream drop
		// it): plugins.BrokerReservedHeader.
		if !plugins.IsInternal(k) && !plugins.BrokerReservedHeader(k) {
			vals = append(vals, v)
			h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
	*nm = nats.Msg{Subject: topic, Data: msg.Payload, Header: h}
	return vals[len(vals):]
}

// ContentTypeHeader is the header holding the content type of a body a
// format encoded (the NATS binding's place for datacontenttype).
const ContentTypeHeader = "content-type"

// encodedMsg is natsMsg for a format other than raw: the encoder's body and
// headers, the content type, and the same id headers.
func encodedMsg(enc *format.Encoder, topic string, msg *message.Message) (*nats.Msg, error) {
	e, err := enc.Encode(msg)
	if err != nil {
		return nil, err
	}
	h := make(nats.Header, len(e.Headers)+3)
	h[wmnats.WatermillUUIDHdr] = []string{msg.UUID}
	h[nats.MsgIdHdr] = []string{plugins.BrokerMessageID(msg)}
	h[ContentTypeHeader] = []string{e.ContentType}
	for _, kv := range e.Headers {
		if _, taken := h[kv.Key]; !taken && !plugins.BrokerReservedHeader(kv.Key) {
			h[kv.Key] = []string{kv.Value}
		}
	}
	return &nats.Msg{Subject: topic, Data: e.Body, Header: h}, nil
}

// Duplicates is how many publishes since Start JetStream confirmed as
// duplicates: a message with their Nats-Msg-Id was in the stream's
// duplicate window, and nothing new was stored.
func (s *Sink) Duplicates() uint64 { return s.dups.total.Load() }

// duplicateWarnEvery bounds the duplicate warnings of one pipeline.
const duplicateWarnEvery = time.Minute

// duplicates counts the PubAcks that said Duplicate and warns about them
// at most once per duplicateWarnEvery.
type duplicates struct {
	total atomic.Uint64

	mu       sync.Mutex
	warned   time.Time // the last warning
	unwarned uint64    // duplicates since it
}

// note counts one duplicate the stream answered for a publish to subject,
// and warns when the last warning is older than duplicateWarnEvery.
func (d *duplicates) note(log *slog.Logger, stream, subject string) {
	d.total.Add(1)
	d.mu.Lock()
	d.unwarned++
	n, now := d.unwarned, time.Now()
	warn := now.Sub(d.warned) >= duplicateWarnEvery
	if warn {
		d.warned, d.unwarned = now, 0
	}
	d.mu.Unlock()
	if warn {
		log.Warn("nats stream dropped events as duplicates: it holds a message with the same Nats-Msg-Id from within its duplicate_window, "+
			"so nothing new was stored; likely another pipeline publishes the same event ids (the same outbox table) into this stream, "+
			"or events were sent again within the duplicate_window",
			"stream", stream, "subject", subject, "duplicates", n, "duplicates_total", d.total.Load())
	}
}

var (
	_ plugins.Sink             = (*Sink)(nil)
	_ plugins.BatchPublisher   = (*Sink)(nil)
	_ plugins.DuplicateCounter = (*Sink)(nil)
)
