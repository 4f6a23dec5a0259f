package nats

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

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
	opts, err := New(c, plugins.Env{Pipeline: pipeline + ":dead-letters"}).options()
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
// stream acknowledged it. The republished message keeps the event's
// Nats-Msg-Id, so a destination stream still deduplicates it.
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
	notes := map[string]bool{}
	// Only what was waiting when the replay began.
	for read := uint64(0); read < n; {
		batch, err := cons.Fetch(int(min(n-read, 256)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return out, fmt.Errorf("read %s: %w", topic, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			read++
			h := m.Headers()
			dest := h.Get(plugins.DeadLetterTopicHeader)
			if dest == "" && h.Get(plugins.DeadLetterStageHeader) == plugins.DeadLetterPublishStage {
				dest = c.Subject // the sink's subject, as Publish chooses it
			}
			switch {
			case !plugins.MatchesReason(f.Reason, h.Get(plugins.DeadLetterReasonHeader), h.Get(plugins.DeadLetterErrorHeader)),
				f.Limit > 0 && out.Replayed >= f.Limit:
				out.Kept++
				continue
			case h.Get(plugins.DeadLetterPayloadBytesHeader) != "":
				notes["dead letters without their payload (too large for the broker) cannot be replayed"] = true
				out.Kept++
				continue
			case dest == "":
				notes[plugins.NoDestinationNote] = true
				out.Kept++
				continue
			case f.Refuses(dest):
				notes[plugins.NoteRefusedDestination] = true
				out.Kept++
				continue
			}
			id := h.Get(nats.MsgIdHdr)
			if f.DryRun {
				out.Replayed++
				out.EventIDs = append(out.EventIDs, id)
				continue
			}
			meta, err := m.Metadata()
			if err != nil {
				return out, err
			}
			msg := &nats.Msg{Subject: dest, Data: m.Data(), Header: nats.Header{}}
			for k, v := range h {
				if !plugins.IsDeadLetterHeader(k) {
					msg.Header[k] = v
				}
			}
			pctx, cancel := context.WithTimeout(ctx, max(c.PublishTimeout, 5*time.Second))
			_, err = js.PublishMsg(pctx, msg)
			cancel()
			if err != nil {
				return out, fmt.Errorf("republish %s to %s: %w", id, dest, err)
			}
			if err := st.DeleteMsg(ctx, meta.Sequence.Stream); err != nil {
				return out, fmt.Errorf("delete %s from the stream of %s (it was republished): %w", id, topic, err)
			}
			out.Replayed++
			out.EventIDs = append(out.EventIDs, id)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return out, fmt.Errorf("read %s: %w", topic, err)
		}
		if got == 0 {
			break
		}
	}
	list := make([]string, 0, len(notes))
	for k := range notes {
		list = append(list, k)
	}
	sort.Strings(list)
	for _, k := range list {
		if out.Note != "" {
			out.Note += "; "
		}
		out.Note += k
	}
	return out, nil
}

var _ plugins.DeadLetterTopicKeeper = (*Config)(nil)
