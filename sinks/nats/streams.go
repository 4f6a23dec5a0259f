package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/plugins"
)

// The stream metadata keys that mark a stream Ferry created: for which
// tenant ("" for the admin's pipelines) and by which pipeline. Ferry
// changes a stream only when the mark names the pipeline's own tenant.
const (
	metaTenant   = "ferry-tenant"
	metaPipeline = "ferry-pipeline"
)

// streamTimeout bounds the stream's look-up, creation or update at start.
const streamTimeout = 10 * time.Second

// ensureStream makes the stream create_stream describes ready for the
// pipeline. Absent, it is created, marked as the pipeline's tenant's.
// Present and marked as this tenant's (or, for an admin's pipeline,
// unmarked: created before the mark, or by hand), it is updated to the
// pipeline's settings. Any other stream is never changed: the sink uses it
// as it is if it captures every subject the pipeline needs, and fails
// otherwise — so a pipeline cannot rewrite, shrink or empty a stream of
// another tenant's by naming it. Called with s.mu held.
func (s *Sink) ensureStream(ctx context.Context) error {
	want := s.streamConfig()
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
	info, err := s.lookUpStream(ctx, want.Name)
	if err != nil {
		return err
	}
	if info == nil && s.dry {
		s.notes = append(s.notes, fmt.Sprintf("would create stream %s capturing %s", want.Name, strings.Join(want.Subjects, ", ")))
		return nil
	}
	if info == nil {
		want.Metadata = map[string]string{metaTenant: s.env.Tenant, metaPipeline: s.env.Pipeline}
		_, err := s.js.CreateStream(ctx, want)
		if err == nil {
			s.log.Info("created nats stream", "stream", want.Name, "subjects", want.Subjects)
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", want.Name, s.rootCause(s.conn, err))
		}
		// Created meanwhile by someone else: judged as any stream present.
		if info, err = s.lookUpStream(ctx, want.Name); err != nil || info == nil {
			return cmp.Or(err, fmt.Errorf("create stream %s: %w", want.Name, jetstream.ErrStreamNameAlreadyInUse))
		}
	}
	return s.useStream(ctx, info, want)
}

// useStream updates a stream of the tenant's own to want, or checks that
// another's captures want's subjects and leaves it as it is.
func (s *Sink) useStream(ctx context.Context, info *jetstream.StreamInfo, want jetstream.StreamConfig) error {
	if s.ownsStream(info.Config.Metadata) {
		if s.dry {
			s.notes = append(s.notes, fmt.Sprintf("stream %s exists and is this tenant's: a start would update it to the pipeline's settings", want.Name))
			return nil
		}
		// The server's own keys and the mark stay as they are.
		want.Metadata = maps.Clone(info.Config.Metadata)
		if _, err := s.js.UpdateStream(ctx, want); err != nil {
			return fmt.Errorf("update stream %s: %w", want.Name, s.rootCause(s.conn, err))
		}
		return nil
	}
	if missing := uncovered(want.Subjects, info.Config.Subjects); len(missing) > 0 {
		owner, marked := info.Config.Metadata[metaTenant]
		if !marked {
			owner = "nobody: not created by Ferry"
		} else if owner == "" {
			owner = "the admin's pipelines"
		}
		// The owner is for the relay's log, which only admins read: the
		// error reaches the pipeline's tenant, who may not learn whose it is.
		s.log.Warn("stream exists and is not this tenant's; left unchanged", "stream", want.Name, "owner", owner,
			"missing_subjects", missing)
		return fmt.Errorf("stream %s exists and is not this tenant's: it does not capture %s, and Ferry changes only "+
			"the streams it created for the pipeline's tenant; name a stream of your own in create_stream.name",
			want.Name, strings.Join(missing, ", "))
	}
	if s.dry {
		s.notes = append(s.notes, fmt.Sprintf("stream %s exists and captures the pipeline's subjects: a start would use it as it is", want.Name))
		return nil
	}
	s.log.Info("using a nats stream Ferry did not create for this tenant, as it is", "stream", want.Name)
	return nil
}

// ownsStream reports whether a stream with this metadata is the
// pipeline's tenant's to change: marked as created for that tenant, or,
// for the admin's pipelines, any stream no tenant's mark claims (the
// admin's pipelines managed their streams before there was a mark).
func (s *Sink) ownsStream(md map[string]string) bool {
	owner, marked := md[metaTenant]
	if !marked {
		return s.env.Tenant == ""
	}
	return owner == s.env.Tenant
}

// lookUpStream is the stream's info, nil when there is no such stream.
func (s *Sink) lookUpStream(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	st, err := s.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", name, s.rootCause(s.conn, err))
	}
	return st.CachedInfo(), nil
}

// streamConfig is the stream create_stream describes.
func (s *Sink) streamConfig() jetstream.StreamConfig {
	sc := s.cfg.CreateStream
	cfg := jetstream.StreamConfig{
		Name:       sc.Name,
		Subjects:   sc.Subjects,
		Replicas:   max(sc.Replicas, 1),
		MaxAge:     sc.MaxAge,
		Duplicates: sc.DuplicateWindow,
		Storage:    jetstream.FileStorage,
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{s.cfg.Subject}
	}
	if sc.Storage == "memory" {
		cfg.Storage = jetstream.MemoryStorage
	}
	switch sc.Retention {
	case "interest":
		cfg.Retention = jetstream.InterestPolicy
	case "workqueue":
		cfg.Retention = jetstream.WorkQueuePolicy
	}
	if sc.Discard == "new" {
		cfg.Discard = jetstream.DiscardNew
	}
	cfg.MaxMsgs, cfg.MaxBytes, cfg.MaxMsgSize = -1, -1, -1
	if sc.MaxMsgs > 0 {
		cfg.MaxMsgs = sc.MaxMsgs
	}
	if sc.MaxBytes > 0 {
		cfg.MaxBytes = sc.MaxBytes
	}
	if sc.MaxMsgSize > 0 {
		cfg.MaxMsgSize = sc.MaxMsgSize
	}
	return cfg
}

// uncovered are the subjects of need that no filter of have captures in
// full (every subject need's item matches, a have filter matches).
func uncovered(need, have []string) []string {
	var out []string
	for _, n := range need {
		if !slices.ContainsFunc(have, func(f string) bool { return subjectCovers(f, n) }) {
			out = append(out, n)
		}
	}
	return out
}

// subjectCovers reports whether every subject sub matches (sub may hold
// wildcards) also matches filter.
func subjectCovers(filter, sub string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(sub, ".")
	for i, f := range ft {
		if f == ">" {
			return i < len(st)
		}
		if i >= len(st) {
			return false
		}
		switch {
		case st[i] == ">":
			return false
		case f == "*":
		case f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

// DryStart connects as Start does but creates and changes no stream: with
// create_stream, the stream is looked up, and what a start would do to it
// is a note ("would create stream ORDERS …"); a stream a start would
// refuse is the error (plugins.DryStarter).
func (s *Sink) DryStart(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	s.dry = true
	s.mu.Unlock()
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.notes), nil
}

var _ plugins.DryStarter = (*Sink)(nil)
