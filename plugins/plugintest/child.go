package plugintest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/pipelines"
)

// childEnv names the pipeline file a re-executed test binary runs;
// readyEnv says its fd 3 is the pipe to report readiness on.
const (
	childEnv = "FERRY_PLUGINTEST_CHILD"
	readyEnv = "FERRY_PLUGINTEST_READY_FD3"
)

// Main runs the tests, then stops the throwaway services they started; in a
// child process started by StartChild (the SIGKILL scenario) it runs the
// pipeline file instead. Call it from TestMain.
func Main(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		os.Exit(runChild(path))
	}
	testenv.Main(m)
}

func runChild(path string) int {
	// SIGTERM is handled from here on: say so (Child.Stop waits for it).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if os.Getenv(readyEnv) != "" {
		ready := os.NewFile(3, "ready")
		_, _ = ready.Write([]byte("ready\n"))
		_ = ready.Close()
	}
	specs, err := pipelines.Loader{Registry: Registry()}.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sup, err := engine.NewSupervisor(engine.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := sup.Run(ctx, specs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Child is a relay running in a subprocess (this test binary, re-executed;
// its TestMain must call Main).
type Child struct {
	cmd *exec.Cmd
	// ready is closed once the child handles SIGTERM (or its pipe closed
	// without a word: it exited). A SIGTERM sent earlier — the events were
	// all delivered before a fresh child got that far, as on a busy
	// machine — kills it with the signal's default action, which is no
	// clean exit.
	ready chan struct{}
}

// StartChild runs the pipeline file in a new process.
func StartChild(t *testing.T, path string) *Child {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path, readyEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{w} // fd 3 in the child
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	c := &Child{cmd: cmd, ready: make(chan struct{})}
	go func() {
		defer close(c.ready)
		defer r.Close()
		_, _ = r.Read(make([]byte, 8))
	}()
	t.Cleanup(func() { c.Kill() })
	return c
}

// Pid is the child's process id, e.g. to read its memory use from /proc.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Kill sends SIGKILL and reaps the process.
func (c *Child) Kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// Stop sends SIGTERM, once the child handles it, and waits for a clean
// exit.
func (c *Child) Stop() error {
	select {
	case <-c.ready:
	case <-time.After(30 * time.Second):
		c.Kill()
		return fmt.Errorf("the child did not start handling SIGTERM within 30s")
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		c.Kill()
		return fmt.Errorf("no exit within 30s of SIGTERM")
	}
}
