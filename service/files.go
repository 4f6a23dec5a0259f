package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// fileLoader is the file pipelines' loader: components from reg, ${VAR}
// from the environment, then from secretsDir. Files are the operator's, so
// they may use both.
func fileLoader(reg *plugins.Registry, secretsDir string) pipelines.Loader {
	l := pipelines.Loader{Registry: reg}
	if secretsDir == "" {
		return l
	}
	l.LookupEnv = func(name string) (string, bool) {
		if v, ok := os.LookupEnv(name); ok {
			return v, true
		}
		if name == "" || strings.ContainsAny(name, `/\`) || name[0] == '.' {
			return "", false
		}
		b, err := os.ReadFile(filepath.Join(secretsDir, name))
		if err != nil {
			return "", false
		}
		return strings.TrimRight(string(b), "\r\n"), true
	}
	return l
}

// loadFiles loads the pipeline files; with a store there may be none.
func (s *Service) loadFiles() ([]*pipelines.Spec, error) {
	if len(s.cfg.Files) == 0 && s.cfg.StoreDSN != "" {
		return nil, nil
	}
	return s.loader.Load(s.cfg.Files...)
}

// watchFiles calls changed when a pipeline file is added, removed or
// modified. It polls modification times: portable, and a config directory
// holds a handful of files.
func watchFiles(ctx context.Context, paths []string, every time.Duration, changed func()) {
	last := fingerprint(paths)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if fp := fingerprint(paths); fp != last {
			last = fp
			changed()
		}
	}
}

func fingerprint(paths []string) string {
	var b strings.Builder
	add := func(p string) {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s %d %d\n", p, st.Size(), st.ModTime().UnixNano())
		}
	}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			continue
		}
		if !st.IsDir() {
			add(p)
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.y*ml"))
		for _, m := range matches {
			add(m)
		}
	}
	return b.String()
}
