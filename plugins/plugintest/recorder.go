package plugintest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/ferryhq/ferry/plugins"
)

// RecorderName is the `type:` of the recording sink the source suite
// delivers to.
const RecorderName = "plugintest_recorder"

// RecorderConfig is the recording sink's YAML section.
type RecorderConfig struct {
	// Path is the file the sink appends one JSON line to per published
	// message. Required.
	Path string `yaml:"path" ferry:"file"`
}

// Validate reports every problem, named by its YAML key.
func (c *RecorderConfig) Validate() error {
	var p plugins.Problems
	if c.Path == "" {
		p.Add("path", "must not be empty")
	}
	return p.Err()
}

// recorderSink records what it is given: Publish returns once the
// messages' line is written to the file (the kernel holds it, so it
// survives the process being killed), which is the sink's confirm. It
// stands in for a broker in the source suite.
type recorderSink struct {
	path string
	down *atomic.Bool

	mu     sync.Mutex
	f      *os.File
	closed bool
}

// outages holds, per recording file, whether its sinks in this process fail
// every publish (Recording.Down).
var outages sync.Map // path → *atomic.Bool

func outage(path string) *atomic.Bool {
	v, _ := outages.LoadOrStore(filepath.Clean(path), new(atomic.Bool))
	return v.(*atomic.Bool)
}

// errRecorderDown is the publish error while a Recording is down.
var errRecorderDown = errors.New("plugintest recorder: down")

func (s *recorderSink) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("plugintest recorder: closed")
	}
	if s.f != nil {
		return nil
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("plugintest recorder: %w", err)
	}
	// A process killed mid-write may have left a partial line: end it, so
	// the next line is whole.
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if r, err := os.Open(s.path); err == nil {
			if _, err := r.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
				_, _ = f.Write([]byte("\n"))
			}
			r.Close()
		}
	}
	s.f = f
	return nil
}

// Recorded is one message as the recording sink got it.
type Recorded struct {
	// Topic is the topic Publish was called with ("" for the default).
	Topic    string            `json:"topic"`
	UUID     string            `json:"uuid"`
	Payload  []byte            `json:"payload"`
	Metadata map[string]string `json:"metadata"`
	// At is when the sink recorded it.
	At time.Time `json:"at"`
}

func (s *recorderSink) Publish(topic string, msgs ...*message.Message) error {
	if s.down.Load() {
		return errRecorderDown
	}
	var buf bytes.Buffer
	now := time.Now()
	for _, m := range msgs {
		b, err := json.Marshal(Recorded{Topic: topic, UUID: m.UUID, Payload: m.Payload, Metadata: m.Metadata, At: now})
		if err != nil {
			return err
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return errors.New("plugintest recorder: publish before Start or after Close")
	}
	// One write for the call, so a kill leaves whole lines or a torn last one.
	_, err := s.f.Write(buf.Bytes())
	return err
}

func (s *recorderSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// RegisterRecorder adds the recording sink to r.
func RegisterRecorder(r *plugins.Registry) {
	plugins.RegisterSink(r, RecorderName, func() *RecorderConfig { return &RecorderConfig{} },
		func(c *RecorderConfig, _ plugins.Env) (plugins.Sink, error) {
			return &recorderSink{path: c.Path, down: outage(c.Path)}, nil
		})
}

// Registry is what the suites load pipelines with: plugins.Default as it is
// now, plus the recording sink. The recorder stays out of Default, so a
// test binary that imports plugintest still lists only real components in
// its "known types" errors.
func Registry() *plugins.Registry {
	r := plugins.Default.Clone()
	RegisterRecorder(r)
	return r
}

// Recording reads what recording sinks appended to one file, from the
// start, in the order they wrote it — across processes, so a relay killed
// with SIGKILL leaves what it confirmed behind.
type Recording struct {
	path string

	mu   sync.Mutex
	off  int64
	msgs []Recorded
	err  error
}

// NewRecording makes a fresh recording file in the test's temporary
// directory.
func NewRecording(t testing.TB) *Recording {
	t.Helper()
	path := filepath.Join(t.TempDir(), "published.jsonl")
	t.Cleanup(func() { outages.Delete(filepath.Clean(path)) })
	return &Recording{path: path}
}

// Through is what a SourceHarness delivers to when it records into r.
func (r *Recording) Through() *Through {
	return &Through{SinkYAML: r.SinkYAML(), Received: r.All,
		Down: func(testing.TB) { r.Down() }, Up: func(testing.TB) { r.Up() }}
}

// Path is the recording file.
func (r *Recording) Path() string { return r.path }

// SinkYAML is the sink section of a pipeline that records into r.
func (r *Recording) SinkYAML() string {
	return fmt.Sprintf("sink:\n  type: %s\n  path: %s\n", RecorderName, r.path)
}

// Down makes the recording sinks of this process fail every publish, as a
// broker outage would, until Up.
func (r *Recording) Down() { outage(r.path).Store(true) }

// Up ends Down.
func (r *Recording) Up() { outage(r.path).Store(false) }

// All returns everything recorded so far.
func (r *Recording) All() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read()
	return append([]Recorded(nil), r.msgs...)
}

// Len is how many messages are recorded so far.
func (r *Recording) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read()
	return len(r.msgs)
}

// read takes in the whole lines appended since the last read.
func (r *Recording) read() {
	f, err := os.Open(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		r.err = err
		return
	}
	defer f.Close()
	if _, err := f.Seek(r.off, 0); err != nil {
		r.err = err
		return
	}
	br := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil { // a line still being written: read it next time
			return
		}
		r.off += int64(len(line))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var m Recorded
		if err := json.Unmarshal(line, &m); err != nil {
			// A line torn by a killed relay: its publish never returned,
			// so the source sends the event again.
			continue
		}
		r.msgs = append(r.msgs, m)
	}
}

// WaitFor polls until cond holds over what is recorded, or fails the test
// after timeout.
func (r *Recording) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Recorded) bool) []Recorded {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msgs := r.All()
		if cond(msgs) {
			return msgs
		}
		if time.Now().After(deadline) {
			r.mu.Lock()
			err := r.err
			r.mu.Unlock()
			t.Fatalf("timed out after %s waiting for %s (%d messages recorded; read error: %v)", timeout, what, len(msgs), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ plugins.Sink = (*recorderSink)(nil)
