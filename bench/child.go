package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Every system under test — Ferry, the watermill-sql baseline, the broker
// ceiling — runs in a child process: the bench's own brokers, writers and
// bookkeeping live in the parent, so the child's CPU time and peak RSS are
// the system's alone, measured the same way for all three.
//
// The parent starts the child (this executable, see ChildEnv), writes one
// job as a JSON line on its stdin, and reads JSON lines from its stdout:
// "ready" once the system runs, "progress" about four times a second, and
// "done" with the measurement. Later stdin lines are commands: "expect"
// (steady: how many events to wait for) and "stop".

// ChildEnv is the environment variable that makes a process a bench child.
// A binary that may be spawned as one calls ChildMain when it is set: the
// ferry-bench command does (`ferry-bench --child`), and so does the bench
// package's TestMain.
const ChildEnv = "FERRY_BENCH_CHILD"

// System names.
const (
	SystemFerry     = "ferry"
	SystemWatermill = "watermill-sql"
	SystemCeiling   = "ceiling"
	// SystemFranzCeiling is Kafka's second ceiling: franz-go's producer
	// alone, where the sink and SystemCeiling use Sarama (ceiling_franz.go).
	SystemFranzCeiling = "ceiling-franz-go"
)

// job is what a child runs.
type job struct {
	System string `json:"system"`
	// Mode is drain (until Expect events are acked), steady (until the
	// expected count arrives on stdin; record each event's ack time) or idle
	// (until stop).
	Mode   string `json:"mode"`
	Expect int    `json:"expect,omitempty"`

	// Ferry: the pipeline file.
	Pipelines string `json:"pipelines,omitempty"`
	// Baseline and ceiling: the sink (type and its YAML config).
	Sink     string `json:"sink,omitempty"`
	SinkYAML string `json:"sink_yaml,omitempty"`
	// Baseline: the database and watermill topic.
	DSN   string `json:"dsn,omitempty"`
	Topic string `json:"topic,omitempty"`
	// Forwarder: the baseline is Watermill's components/forwarder reading
	// envelopes from Topic, instead of a router handler publishing each
	// message.
	Forwarder bool `json:"forwarder,omitempty"`
	// Baseline: the publisher its handler forwards to (publisherWatermill,
	// default, or publisherFerry), the topic it publishes to, and the
	// subscriber's batch size (0: watermillBatch).
	Publisher   string `json:"publisher,omitempty"`
	Destination string `json:"destination,omitempty"`
	Batch       int    `json:"batch,omitempty"`
	// Ceiling steady: publish Rate events/s for Duration.
	Rate     int           `json:"rate,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	// Ceiling: the async publish window (NATS pending acks, AMQP unconfirmed
	// per channel).
	Window int `json:"window,omitempty"`
	// Profile, when set, is where the child writes a CPU profile of the
	// measurement (start to done), and next to it the allocations.
	Profile string `json:"profile,omitempty"`
}

// childMsg is one line a child writes.
type childMsg struct {
	Event string `json:"event"` // ready, progress, done, error
	Acked int64  `json:"acked,omitempty"`
	Error string `json:"error,omitempty"`
	// done:
	Start   int64   `json:"start,omitempty"`    // unix ns: the system was started
	Ready   int64   `json:"ready,omitempty"`    // unix ns: it reported ready
	Last    int64   `json:"last,omitempty"`     // unix ns: the last expected ack
	CPU     float64 `json:"cpu,omitempty"`      // CPU seconds between start (drain) or ready (steady) and done
	CPUFrom string  `json:"cpu_from,omitempty"` // start or ready
	// Acks are [outbox id, ack unix ns] (steady); Latencies are publish→ack
	// in ns (ceiling steady).
	Acks      [][2]int64 `json:"acks,omitempty"`
	Latencies []int64    `json:"latencies,omitempty"`
}

type command struct {
	Expect int  `json:"expect,omitempty"`
	Stop   bool `json:"stop,omitempty"`
	// Measure starts the CPU profile of an idle child (its window begins).
	Measure bool `json:"measure,omitempty"`
}

// ChildMain runs one bench job read from stdin, reporting on stdout; it
// returns the exit code.
func ChildMain(stdin io.Reader, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		fmt.Fprintln(stderr, "bench child: read job:", err)
		return 2
	}
	var j job
	if err := json.Unmarshal(line, &j); err != nil {
		fmt.Fprintln(stderr, "bench child: decode job:", err)
		return 2
	}
	c := &child{job: j, out: json.NewEncoder(stdout), log: log, expect: make(chan int, 1), stop: make(chan struct{})}
	go c.commands(in)
	// Idle is profiled over the parent's measurement window (the measure
	// command), the others from the start.
	if j.Profile != "" && j.Mode != modeIdle {
		if err := c.startProfile(); err != nil {
			fmt.Fprintln(stderr, "bench child: profile:", err)
			return 2
		}
	}
	if err := c.run(); err != nil {
		c.send(childMsg{Event: "error", Error: err.Error()})
		fmt.Fprintln(stderr, "bench child:", err)
		return 1
	}
	return 0
}

// child is the running side of the protocol, shared by the systems.
type child struct {
	job job
	log *slog.Logger

	outMu sync.Mutex
	out   *json.Encoder

	expect   chan int
	stop     chan struct{}
	stopOnce sync.Once

	acked atomic.Int64
	last  atomic.Int64 // unix ns of the latest ack

	recMu sync.Mutex
	acks  [][2]int64

	profMu      sync.Mutex
	stopProfile func()
}

// startProfile starts the CPU profile; measured stops it and also writes the
// allocation profile, which counts from the process's start (cumulative).
func (c *child) startProfile() error {
	f, err := os.Create(c.job.Profile)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	c.profMu.Lock()
	defer c.profMu.Unlock()
	c.stopProfile = func() {
		pprof.StopCPUProfile()
		f.Close()
		// And what was allocated, for the per-event allocations.
		if a, err := os.Create(strings.TrimSuffix(c.job.Profile, ".pprof") + ".allocs.pprof"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			a.Close()
		}
	}
	return nil
}

// measured ends the measurement: the profiles stop here, before the system
// shuts down.
func (c *child) measured() {
	c.profMu.Lock()
	defer c.profMu.Unlock()
	if c.stopProfile != nil {
		c.stopProfile()
		c.stopProfile = nil
	}
}

func (c *child) send(m childMsg) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	_ = c.out.Encode(m)
}

func (c *child) commands(in *bufio.Reader) {
	dec := json.NewDecoder(in)
	for {
		var cmd command
		if err := dec.Decode(&cmd); err != nil {
			// The parent went away or closed stdin: stop.
			c.stopOnce.Do(func() { close(c.stop) })
			return
		}
		if cmd.Expect > 0 {
			c.expect <- cmd.Expect
		}
		if cmd.Measure && c.job.Profile != "" {
			if err := c.startProfile(); err != nil {
				c.log.Warn("profile", "err", err)
			}
		}
		if cmd.Stop {
			c.measured()
			c.stopOnce.Do(func() { close(c.stop) })
		}
	}
}

// acked records that the broker confirmed msgs events; id is the event's
// outbox id, recorded with its ack time in steady mode.
func (c *child) ack(id int64) {
	now := time.Now().UnixNano()
	c.acked.Add(1)
	c.last.Store(now)
	if c.job.Mode == modeSteady {
		c.recMu.Lock()
		c.acks = append(c.acks, [2]int64{id, now})
		c.recMu.Unlock()
	}
}

func (c *child) run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sys system
	switch c.job.System {
	case SystemFerry:
		sys = &ferrySystem{c: c}
	case SystemWatermill:
		sys = &watermillSystem{c: c}
	case SystemCeiling, SystemFranzCeiling:
		return c.runCeiling(ctx)
	default:
		return fmt.Errorf("unknown system %q", c.job.System)
	}
	startCPU := cpuSeconds()
	start := time.Now()
	if err := sys.start(ctx); err != nil {
		return err
	}
	defer sys.stop()
	if err := sys.ready(ctx, c.stop); err != nil {
		return err
	}
	ready := time.Now()
	readyCPU := cpuSeconds()
	c.send(childMsg{Event: "ready"})

	progress := time.NewTicker(250 * time.Millisecond)
	defer progress.Stop()
	expect := c.job.Expect
	if c.job.Mode == modeIdle {
		expect = -1
	}
	for {
		if expect > 0 && c.acked.Load() >= int64(expect) {
			break
		}
		select {
		case <-c.stop:
			if c.job.Mode == modeIdle {
				return nil
			}
			return errors.New("stopped before every event was acked")
		case <-sys.failed():
			return fmt.Errorf("system failed: %v", sys.err())
		case n := <-c.expect:
			expect = n
		case <-progress.C:
			c.send(childMsg{Event: "progress", Acked: c.acked.Load()})
		}
	}
	c.measured()
	done := childMsg{Event: "done", Acked: c.acked.Load(), Start: start.UnixNano(), Ready: ready.UnixNano(), Last: c.last.Load()}
	if c.job.Mode == modeSteady {
		done.CPU, done.CPUFrom = cpuSeconds()-readyCPU, "ready"
		c.recMu.Lock()
		done.Acks = c.acks
		c.recMu.Unlock()
	} else {
		done.CPU, done.CPUFrom = cpuSeconds()-startCPU, "start"
	}
	c.send(done)
	// The parent reads the peak RSS from /proc before it says stop.
	<-c.stop
	return nil
}

// system is one thing a child can run against the database and a broker.
type system interface {
	start(ctx context.Context) error
	// ready blocks until the system reads and publishes.
	ready(ctx context.Context, stop <-chan struct{}) error
	failed() <-chan struct{}
	err() error
	stop()
}

// cpuSeconds is this process's user+system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tv(ru.Utime) + tv(ru.Stime)
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// proc is a running child, seen from the parent.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan childMsg
	stderr *tailBuffer
	exited chan struct{}
}

// spawn starts a child running j.
func spawn(j job) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "--child")
	cmd.Env = append(os.Environ(), ChildEnv+"=1")
	// The child dies with the bench, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, lines: make(chan childMsg, 64), stderr: &tailBuffer{max: 16 << 10}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(p.lines)
		dec := json.NewDecoder(stdout)
		for {
			var m childMsg
			if err := dec.Decode(&m); err != nil {
				return
			}
			p.lines <- m
		}
	}()
	b, _ := json.Marshal(j)
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	return p, nil
}

func (p *proc) send(c command) {
	b, _ := json.Marshal(c)
	_, _ = p.stdin.Write(append(b, '\n'))
}

// next returns the child's next message; ok is false once its output ended.
func (p *proc) next(ctx context.Context) (childMsg, error) {
	select {
	case m, ok := <-p.lines:
		if !ok {
			return childMsg{}, fmt.Errorf("child exited: %s", p.stderr.String())
		}
		if m.Event == "error" {
			return m, fmt.Errorf("child: %s", m.Error)
		}
		return m, nil
	case <-ctx.Done():
		return childMsg{}, ctx.Err()
	}
}

// finish reads the child's peak RSS, asks it to stop and waits for it
// (killing it after grace).
//
// The peak comes from /proc (VmHWM) while the child still runs, not from
// wait4's rusage: exec after a vfork-style clone carries the parent's
// high-water mark into the child's ru_maxrss, which would report the
// bench's own memory.
func (p *proc) finish(grace time.Duration) (peakRSS int64, err error) {
	peakRSS, _ = p.peakRSS()
	p.send(command{Stop: true})
	_ = p.stdin.Close()
	done := make(chan error, 1)
	go func() {
		for range p.lines {
		}
		done <- p.cmd.Wait()
	}()
	select {
	case err = <-done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		err = <-done
		if err == nil {
			err = errors.New("killed after the stop grace period")
		}
	}
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	return peakRSS, err
}

// peakRSS is the child's resident set high-water mark (VmHWM), in bytes.
func (p *proc) peakRSS() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb); err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// kill ends the child at once.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	for range p.lines {
	}
	_ = p.cmd.Wait()
}

// cpuTicks reads the child's user+system time from /proc (idle measures it
// from outside, over a window the parent chooses).
func (p *proc) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat")
	}
	return statCPU(s[i+1:])
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// tailBuffer keeps the last max bytes written (a child's log).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
