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

// childEnv names the pipeline file a re-executed test binary runs.
const childEnv = "FERRY_PLUGINTEST_CHILD"

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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := sup.Run(ctx, specs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Child is a relay running in a subprocess (this test binary, re-executed;
// its TestMain must call Main).
type Child struct{ cmd *exec.Cmd }

// StartChild runs the pipeline file in a new process.
func StartChild(t *testing.T, path string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd}
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

// Stop sends SIGTERM and waits for a clean exit.
func (c *Child) Stop() error {
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
