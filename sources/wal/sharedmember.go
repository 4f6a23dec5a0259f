package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
	"github.com/ferryhq/ferry/sources/backfill"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// A member's side of the shared stream (see shared.go): joining, waiting
// while the stream routes its events, rejoining after a stall, and leaving
// with its position recorded; and the stream's one watcher, checker and
// heartbeat for all its members.

// runShared runs the source as a member of its database's shared stream
// until runCtx ends or the stream fails for good.
func (s *Source) runShared(runCtx context.Context) {
	s.slots.metrics.register(s.env.Metrics, s.log)
	h, err := s.acquireLoop(runCtx)
	switch {
	case err != nil:
		s.fail(err)
	case h == nil: // stopped while it waited
	default:
		m := &member{src: s, ctx: runCtx}
		// Running while it moves off its own slot, too: the watcher must
		// not call it stopped.
		h.mu.Lock()
		h.all[m] = struct{}{}
		h.mu.Unlock()
		if s.migrateLoop(runCtx, h) {
			s.memberLoop(runCtx, h, m)
			h.leave(m)
			s.leaveShared(h, m)
		} else {
			// Stopped while moving: the own slot holds its position, and
			// the member's row stays at the shared position.
			h.leave(m)
		}
		if s.stopWatch != nil {
			s.stopWatch()
		}
		s.bg.Wait() // the snapshot's watcher uses the stream's pool
		h.release()
	}
	s.stream.win.Close()
	pgsource.WaitIdle(s.log, pgsource.DrainTimeout(s.env), s.stream.win.Idle)
}

// memberLoop joins the stream, and joins again after the stream detached
// the member (a stall, or a row its table's columns cannot decode), until
// ctx ends or the stream fails.
func (s *Source) memberLoop(ctx context.Context, h *sharedStream, m *member) {
	bo := retry.Backoff()
	for ctx.Err() == nil {
		err := h.join(ctx, m)
		if err == nil {
			err = s.member(ctx, h, m)
			if err == nil {
				bo.Reset()
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		var f *fatal
		if errors.As(err, &f) {
			s.fail(err)
			return
		}
		d := bo.NextBackOff()
		s.env.Report.Failing(fmt.Errorf("wal source (shared slot %s): %w", h.slot, err), d)
		s.log.Error("wal source cannot join the shared stream; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// migrateLoop moves the member off its former own slot (migrate.go),
// retrying with backoff; false when ctx ended or the source failed.
func (s *Source) migrateLoop(ctx context.Context, h *sharedStream) bool {
	bo := retry.Backoff()
	for ctx.Err() == nil {
		err := s.migrate(ctx, h)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		var f *fatal
		if errors.As(err, &f) {
			s.fail(err)
			return false
		}
		d := bo.NextBackOff()
		s.env.Report.Failing(fmt.Errorf("wal source (moving to shared slot %s): %w", h.slot, err), d)
		s.log.Error("wal source cannot move from its own slot to the shared slot; retrying", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	return false
}

// member waits while the stream routes the member's events. It returns
// nil to join again (the member stalled and has room now), or why the
// member cannot go on.
func (s *Source) member(ctx context.Context, h *sharedStream, m *member) error {
	select {
	case <-ctx.Done():
		return nil
	case <-h.failed:
		h.mu.Lock()
		err := h.failure
		h.mu.Unlock()
		return &fatal{err}
	case why := <-m.out:
		if !errors.Is(why, errStalled) {
			return why
		}
	}
	// Stalled: the broker is slow or down. Rejoin once half the window is
	// free, so the stream does not go back for every event the member acks.
	s.log.Warn("wal source detached from the shared stream: its window stayed full; it rejoins from its position once half of it is free",
		"stall_limit", sharedStallLimit)
	win := s.stream.win
	for {
		// The stream records no acks while the member is out: free their
		// room here (its row is written once it rejoined).
		_, mark := s.stream.deliverable()
		win.Recorded(mark)
		if win.Room() >= max(1, s.env.MaxInFlight/2) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-win.Progressed():
		case <-time.After(s.cfg.StatusInterval):
		}
	}
}

// leaveShared drains the member's window after it left the stream and
// records how far it delivered: its row is where it resumes, and what
// holds the shared slot back while it is stopped.
func (s *Source) leaveShared(h *sharedStream, m *member) {
	drainCtx, cancel := context.WithTimeout(context.Background(), pgsource.DrainTimeout(s.env))
	if err := s.stream.win.Drain(drainCtx); err != nil {
		s.log.Warn("drain timed out; unacked events will be sent again on restart", "held", s.stream.win.Stats().Held)
	}
	cancel()
	h.joinMu.Lock()
	opened := h.pool != nil // another member may be opening it
	h.joinMu.Unlock()
	if !opened {
		return
	}
	confirm, mark := s.stream.deliverable()
	if confirm > m.persisted {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := h.persist(ctx, []string{s.env.Pipeline}, []string{confirm.String()})
		cancel()
		if err != nil {
			s.log.Error("record the pipeline's position in the shared stream; it resumes from the last one recorded", "err", redact.Error(err))
		} else {
			m.persisted = confirm
			s.stream.recorded(confirm, mark)
		}
	}
	s.stream.recordBackfill()
	s.log.Info("wal source left the shared stream", "position", m.persisted.String())
}

// attached lists the members joined and not left.
func (h *sharedStream) attached() []*member {
	h.mu.Lock()
	defer h.mu.Unlock()
	ms := make([]*member, 0, len(h.all))
	for m := range h.all {
		ms = append(ms, m)
	}
	return ms
}

// watch measures the shared slot and every member's row each
// metrics_interval: each member's health and gauges show the slot, its own
// distance, and which member holds the slot back furthest. A member that is
// not running and holds it back is logged, and split off once it is
// split_after_bytes behind (sharedsplit.go).
func (h *sharedStream) watch(ctx context.Context) {
	warned := ""
	reported := map[string]bool{} // split-off slots given gauges
	pgsource.WatchHealth(ctx, h.cfg.MetricsInterval, h.log, "measure the shared replication slot", &h.slots.health, func(ctx context.Context) error {
		members := h.attached()
		sh, err := readSlotHealth(ctx, h.pool, h.slot)
		var lags []memberLag
		if err == nil {
			lags, err = h.readMemberLags(ctx)
		}
		if err != nil {
			for _, m := range members {
				m.src.slots.health.Fail(err)
			}
			return err
		}
		running := map[string]bool{}
		for _, m := range members {
			running[m.src.env.Pipeline] = true
		}
		behind := map[string]int64{}
		for _, l := range lags {
			behind[l.pipeline] = l.behind
		}
		for _, m := range members {
			hl := sh.health(m.src.stream.pending.oldest())
			own := behind[m.src.env.Pipeline]
			hl.Backlog = own
			hl.Details["shared"] = true
			hl.Details["member_behind_bytes"] = own
			if len(lags) > 0 {
				hl.Details["slowest_member"] = lags[0].pipeline
				hl.Details["slowest_member_behind_bytes"] = lags[0].behind
				hl.Details["slowest_member_running"] = running[lags[0].pipeline]
			}
			m.src.slots.metrics.set(sh)
			m.src.slots.metrics.behind.WithLabelValues(h.slot).Set(float64(own))
			m.src.slots.health.Store(hl)
		}
		if len(lags) > 0 && !running[lags[0].pipeline] && lags[0].behind > 0 && warned != lags[0].pipeline {
			warned = lags[0].pipeline
			h.log.Warn("a shared-slot pipeline that is not running holds the slot's WAL back; resume it, or delete it to release the WAL "+
				"(past split_after_bytes it gets a slot of its own)",
				"holding_pipeline", lags[0].pipeline, "behind_bytes", lags[0].behind, "split_after_bytes", h.cfg.SplitAfterBytes)
		} else if len(lags) == 0 || running[lags[0].pipeline] {
			warned = ""
		}
		h.splitIdle(ctx, lags, running)
		return h.reportSplit(ctx, members, reported)
	})
}

// checkBackfills is the stream's one check for backfill requests, every
// second, for all its members: one query per request table (usually one
// per database) instead of one per member. A member with a request is
// woken; its own runner then reads and sends it beside the stream.
func (h *sharedStream) checkBackfills(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	exists := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		byTable := map[string]map[string]*member{}
		for _, m := range h.attached() {
			if m.src.cfg.Columns.ID == "" {
				continue
			}
			tbl := backfill.TablesFor(m.src.cfg.Table).Requests
			if byTable[tbl] == nil {
				byTable[tbl] = map[string]*member{}
			}
			byTable[tbl][m.src.env.Pipeline] = m
		}
		for tbl, ms := range byTable {
			if err := h.checkRequests(ctx, tbl, ms, exists); err != nil && ctx.Err() == nil {
				h.log.Debug("check backfill requests", "err", redact.Error(err))
			}
		}
	}
}

func (h *sharedStream) checkRequests(ctx context.Context, tbl string, ms map[string]*member, exists map[string]bool) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !exists[tbl] {
		var ok bool
		if err := h.pool.QueryRow(qctx, `SELECT to_regclass($1) IS NOT NULL`, tbl).Scan(&ok); err != nil || !ok {
			return err
		}
		exists[tbl] = true
	}
	pipelines := make([]string, 0, len(ms))
	for p := range ms {
		pipelines = append(pipelines, p)
	}
	var waiting []string
	if err := h.pool.QueryRow(qctx, `SELECT coalesce(array_agg(DISTINCT pipeline), '{}') FROM `+tbl+`
		WHERE finished_at IS NULL AND replay AND pipeline = ANY($1)`, pipelines).Scan(&waiting); err != nil {
		exists[tbl] = false
		return err
	}
	for _, p := range waiting {
		ms[p].backfill.Store(true)
	}
	return nil
}

// heartbeat writes one logical decoding message for the shared slot every
// heartbeat_interval (see streamer.heartbeat): every member confirms past it.
func (h *sharedStream) heartbeat(ctx context.Context) {
	t := time.NewTicker(h.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := h.pool.Exec(qctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', $1)`, "shared:"+h.slot)
		cancel()
		if err != nil && ctx.Err() == nil {
			h.log.Warn("write heartbeat; a quiet database's shared slot may not advance", "err", redact.Error(err))
		}
	}
}
