package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/service"
)

// childEnv names the pipeline file a re-executed test binary runs with
// `ferry run`; argsEnv holds the flags after it, one per line.
const (
	childEnv = "FERRY_CHAOS_CHILD"
	argsEnv  = "FERRY_CHAOS_CHILD_ARGS"
)

// ChildArgs are the `ferry run` flags of the process under test, after
// `-c FILE`: high availability on (the default) with short rounds, so a
// restarted process owns its pipeline again quickly.
var ChildArgs = []string{"--ha-interval", "500ms", "--shutdown-timeout", "5s", "--log-level", "warn"}

// Main runs the tests and stops the chaos cluster afterwards; in a child
// process started by StartChild it runs `ferry run` instead.
func Main(m *testing.M) {
	if path := os.Getenv(childEnv); path != "" {
		args := strings.Split(os.Getenv(argsEnv), "\n")
		os.Exit(service.MainArgs(append([]string{"-c", path}, args...), os.Stdout, os.Stderr, nil))
	}
	code := m.Run()
	stopCluster()
	os.Exit(code)
}

// Child is Ferry running a pipeline file in another process: this test
// binary, re-executed, running `ferry run` as service.Main does.
type Child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartChild starts `ferry run -c path args…`; its output is appended to
// logPath. It is killed when the test ends.
func StartChild(t testing.TB, path, logPath string, args []string) *Child {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if level := os.Getenv("FERRY_CHAOS_LOG_LEVEL"); level != "" {
		// The last --log-level wins.
		args = append(slices.Clone(args), "--log-level", level)
	}
	cmd.Env = append(os.Environ(), childEnv+"="+path, argsEnv+"="+strings.Join(args, "\n"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(c.Kill)
	return c
}

// Kill sends SIGKILL and reaps the process. Safe to call twice.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// Exited reports whether the process ended (and how).
func (c *Child) Exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// Dump has the Go runtime write every goroutine's stack to the log and
// exit (SIGQUIT); for a process that is stuck.
func (c *Child) Dump() {
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.Kill()
	}
}

// Stop sends SIGTERM and waits for a clean exit: drain, record progress,
// exit 0.
func (c *Child) Stop(timeout time.Duration) error {
	if exited, err := c.Exited(); exited {
		return fmt.Errorf("the process had already exited: %v", err)
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return c.err
	case <-time.After(timeout):
		c.Kill()
		return fmt.Errorf("no exit within %s of SIGTERM", timeout)
	}
}
