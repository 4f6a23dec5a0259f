package xid8_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryhq/ferry/plugins/plugintest"
)

// A relay process stopped right after it started exits cleanly: the kill
// scenarios stop a fresh child as soon as every event arrived, which on a
// busy machine can be before it got as far as handling SIGTERM.
func TestChildStoppedRightAfterStart(t *testing.T) {
	e := plugintest.SetupSource(t, harness)
	path := filepath.Join(t.TempDir(), "pipeline.yaml")
	if err := os.WriteFile(path, []byte(e.YAML("stopearly", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := plugintest.StartChild(t, path).Stop(); err != nil {
			t.Fatalf("relay did not exit cleanly on SIGTERM right after start: %v", err)
		}
	}
}
