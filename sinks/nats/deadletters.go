package nats

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/plugins"
)

// A dead-letter topic on NATS is a subject; JetStream keeps what a stream
// captures. Counting asks the stream for the subject's messages; a replay
// reads them with an ordered consumer, republishes each to its destination
// (waiting for the PubAck) and deletes it from the stream.

func (c *Config) connectDeadLetters(ctx context.Context, pipeline string) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := c.options("ferry:"+pipeline+":dead-letters", plugins.DialFrom(ctx))
	if err != nil {
		return nil, nil, err
	}
	// One request, not a pipeline: fail when the server cannot be reached.
	opts = append(opts, nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))
	conn, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, nil, redact.Error(fmt.Errorf("connect nats: %w", err))
	}
	js, err := jetstream.New(conn)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, js, nil
}

// deadLetterStream finds the stream capturing topic; nil when none does.
func deadLetterStream(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Stream, uint64, error) {
	name, err := js.StreamNameBySubject(ctx, topic)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(topic))
	if err != nil {
		return nil, 0, err
	}
	return st, info.State.Subjects[topic], nil
}

func noStreamNote(topic string) string {
	return fmt.Sprintf("no JetStream stream captures subject %q: its dead letters were not kept; "+
		"create a stream on it (separate from the destinations' streams, so a replay is not taken for a duplicate) to keep, count and replay them", topic)
}

// CountDeadLetterTopic counts the stream's messages on topic.
func (c *Config) CountDeadLetterTopic(ctx context.Context, pipeline, topic string) (plugins.DeadLetterTopicCount, error) {
	out := plugins.DeadLetterTopicCount{Topic: topic}
	conn, js, err := c.connectDeadLetters(ctx, pipeline)
	if err != nil {
		return out, err
	}
	defer conn.Close()
	st, n, err := deadLetterStream(ctx, js, topic)
	if err != nil {
		return out, fmt.Errorf("inspect the stream of %s: %w", topic, err)
	}
	if st == nil {
		out.Note = noStreamNote(topic)
		return out, nil
	}
	count := int64(n)
	out.Count = &count
	out.Note = fmt.Sprintf("messages on subject %q in stream %s", topic, st.CachedInfo().Config.Name)
	return out, nil
}

// ReplayDeadLetterTopic republishes the dead letters on topic, oldest
// first, and deletes each one from the stream once its destination's
// stream acknowledged it. The republished message's Nats-Msg-Id is
// "<event id>:replay-<this replay>", so a destination stream that saw the
// event id within its duplicate window (the dead-letter subject in the same
// stream, an earlier delivery) stores it all the same; the event id stays
// in Watermill's uuid header. A replay the stream still answers Duplicate
// for is counted in Duplicates.
func (c *Config) ReplayDeadLetterTopic(ctx context.Context, pipeline, topic string, f plugins.DeadLetterFilter) (plugins.DeadLetterTopicReplay, error) {
	out := plugins.DeadLetterTopicReplay{Topic: topic, EventIDs: []string{}}
	conn, js, err := c.connectDeadLetters(ctx, pipeline)
	if err != nil {
		return out, err
	}
	defer conn.Close()
	st, n, err := deadLetterStream(ctx, js, topic)
	if err != nil {
		return out, fmt.Errorf("inspect the stream of %s: %w", topic, err)
	}
	if st == nil {
		out.Note = noStreamNote(topic)
		return out, nil
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{topic}, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return out, fmt.Errorf("read %s: %w", topic, err)
	}
	r := &streamReplay{cfg: c, js: js, stream: st, topic: topic, filter: f, out: &out, notes: map[string]bool{},
		resend: "replay-" + watermill.NewShortUUID()}
	// Only what was waiting when the replay began.
	if err := r.run(ctx, cons, n); err != nil {
		return out, err
	}
	out.Note = strings.Join(slices.Sorted(maps.Keys(r.notes)), "; ")
	return out, nil
}

// streamReplay is one replay of the dead letters a stream keeps on a
// subject.
type streamReplay struct {
	cfg    *Config
	js     jetstream.JetStream
	stream jetstream.Stream
	topic  string
	filter plugins.DeadLetterFilter
	out    *plugins.DeadLetterTopicReplay
	notes  map[string]bool
	// resend names this replay in the republished messages' Nats-Msg-Id
	// (as plugins.MetaResend does a source's re-send).
	resend string
}

// run reads the first n messages on the subject, in batches, and replays
// each.
func (r *streamReplay) run(ctx context.Context, cons jetstream.Consumer, n uint64) error {
	for read := uint64(0); read < n; {
		batch, err := cons.Fetch(int(min(n-read, 256)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", r.topic, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			if err := r.replay(ctx, m); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read %s: %w", r.topic, err)
		}
		if got == 0 {
			break
		}
	}
	return nil
}

// replay decides what becomes of one dead letter: kept on the stream,
// counted (a dry run), or republished and deleted.
func (r *streamReplay) replay(ctx context.Context, m jetstream.Msg) error {
	h := m.Headers()
	// An event the broker refused without a topic went to the sink's
	// subject, as Publish chooses it.
	dest, note := r.filter.ReplayDestination(h.Get, r.out.Replayed, r.cfg.Subject)
	if dest == "" {
		if note != "" {
			r.notes[note] = true
		}
		r.out.Kept++
		return nil
	}
	id := h.Get(wmnats.WatermillUUIDHdr)
	if id == "" {
		id, _, _ = strings.Cut(h.Get(nats.MsgIdHdr), ":")
	}
	if !r.filter.DryRun {
		if err := r.republish(ctx, m, dest, id); err != nil {
			return err
		}
	}
	r.out.Replayed++
	r.out.EventIDs = append(r.out.EventIDs, id)
	return nil
}

// republish publishes m to dest without the dead-letter headers, waits
// for the PubAck and then deletes m from the dead-letter stream.
func (r *streamReplay) republish(ctx context.Context, m jetstream.Msg, dest, id string) error {
	meta, err := m.Metadata()
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: dest, Data: m.Data(), Header: nats.Header{}}
	for k, v := range m.Headers() {
		if !plugins.IsDeadLetterHeader(k) {
			msg.Header[k] = v
		}
	}
	if msg.Header.Get(wmnats.WatermillUUIDHdr) == "" {
		msg.Header.Set(wmnats.WatermillUUIDHdr, id) // where the event id stays
	}
	msg.Header.Set(nats.MsgIdHdr, id+":"+r.resend)
	pctx, cancel := context.WithTimeout(ctx, max(r.cfg.PublishTimeout, 5*time.Second))
	ack, err := r.js.PublishMsg(pctx, msg)
	cancel()
	if err != nil {
		return fmt.Errorf("republish %s to %s: %w", id, dest, err)
	}
	if ack.Duplicate {
		r.out.Duplicates++
	}
	if err := r.stream.DeleteMsg(ctx, meta.Sequence.Stream); err != nil {
		return fmt.Errorf("delete %s from the stream of %s (it was republished): %w", id, r.topic, err)
	}
	return nil
}

var _ plugins.DeadLetterTopicKeeper = (*Config)(nil)
