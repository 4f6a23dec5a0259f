package httpapi

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
)

// SummaryFields names the columns of each row GET /api/v1/summary answers,
// in order. A row is an array, not an object: at a thousand pipelines the
// keys repeated on every row would be most of the bytes.
var SummaryFields = []string{
	"name", "tenant", "state", "in_state_seconds", "owner", "source", "sink",
	"backlog", "backlog_unit", "oldest_age_seconds", "p99_commit_to_ack_seconds",
	"dead_letters", "last_error",
}

// Summary is the fleet view's one request: every pipeline the caller may
// see, one compact row each (SummaryFields), so the console refreshes a
// thousand pipelines with one small answer instead of one per pipeline.
type Summary struct {
	Fields []string `json:"fields"`
	Rows   [][]any  `json:"rows"`
	// Stale: the store could not be read; the rows are the last state read.
	Stale bool `json:"stale"`
	// GeneratedAt is when the rows were taken; in_state_seconds counts to it.
	GeneratedAt time.Time `json:"generated_at"`
}

// lastErrorMax bounds the one line of last_error a row carries: the
// pipeline's page shows the whole text.
const lastErrorMax = 160

// summary answers GET /api/v1/summary: the rows of the pipelines the
// caller's scope may see (as listPipelines filters them), optionally one
// tenant's.
func (c *api) summary(w http.ResponseWriter, r *http.Request, p principal) {
	tenant := r.URL.Query().Get("tenant")
	_, filtered := r.URL.Query()["tenant"]
	if filtered && !p.actor.Scope.CanSeeTenant(tenant) {
		writeProblem(w, &problem{code: http.StatusForbidden, msg: fmt.Sprintf("scope %s may not read tenant %q", p.actor.Scope, tenant)})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	all, stale := c.views(ctx)
	seen := all[:0]
	for _, v := range all {
		if (filtered && v.Tenant != tenant) || !p.actor.Scope.CanSeeTenant(v.Tenant) {
			continue
		}
		seen = append(seen, v)
	}
	var dead map[string]uint64
	if c.o.Console != nil {
		dead = c.o.Console.DeadLettered()
	}
	s := Summarize(seen, dead, time.Now())
	s.Stale = stale
	w.Header().Set("Content-Type", "application/json")
	w.Header().Add("Vary", "Accept-Encoding")
	// Compact and, when the client takes it, gzipped, unlike the other
	// answers: this one is polled every 2 s (at 1,000 pipelines about
	// 100 KB plain, 10 KB gzipped; BenchmarkSummary).
	if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		_ = json.NewEncoder(w).Encode(s)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	z := gzip.NewWriter(w)
	_ = json.NewEncoder(z).Encode(s)
	_ = z.Close()
}

// Summarize builds the summary of views; dead is each pipeline's events
// dead-lettered by its stages since this instance started (the console's
// count), now the time in_state_seconds counts to.
func Summarize(views []PipelineView, dead map[string]uint64, now time.Time) Summary {
	s := Summary{Fields: SummaryFields, Rows: make([][]any, 0, len(views)), GeneratedAt: now.UTC()}
	for _, v := range views {
		state, owner, lastErr := placement(v)
		var backlog, oldest, p99 any
		unit := ""
		if h := v.Health; h != nil && !h.CheckedAt.IsZero() && !h.Failing() {
			backlog, unit, oldest = h.Backlog, h.BacklogUnit, round(h.OldestAge.Seconds(), 1e3)
		} else if h != nil && h.Failing() && lastErr == "" {
			lastErr = "backlog cannot be measured: " + h.MeasureError
		}
		if l, ok := v.Lag[plugins.SegmentCommitToAck]; ok && l.Count > 0 {
			p99 = round(l.P99, 1e6)
		}
		deadLetters := dead[v.Name]
		if v.Flow != nil {
			deadLetters += v.Flow.GivenUp // parked by the source (poll)
		}
		inState := int64(0)
		if !v.Since.IsZero() {
			inState = max(int64(now.Sub(v.Since).Seconds()), 0)
		}
		s.Rows = append(s.Rows, []any{v.Name, v.Tenant, state, inState, owner, v.Source, v.Sink,
			backlog, unit, oldest, p99, deadLetters, oneLine(lastErr)})
	}
	return s
}

// placement is where a pipeline runs and in what state, as the fleet sees
// it: with high availability the owner every instance names; else the
// instances that reported it through the store (their state when this one
// only holds it in standby); else this instance ("" owner).
func placement(v PipelineView) (state, owner, lastErr string) {
	state, lastErr = string(v.State), v.LastError
	if v.Owner != "" {
		return state, v.Owner, lastErr
	}
	if len(v.RunningOn) > 0 {
		names := make([]string, len(v.RunningOn))
		for i, in := range v.RunningOn {
			names[i] = in.Instance
		}
		if v.State == engine.StateStandby || v.State == StatePending {
			state = v.RunningOn[0].State
			if lastErr == "" {
				lastErr = v.RunningOn[0].LastError
			}
		}
		return state, strings.Join(names, ","), lastErr
	}
	if lastErr == "" {
		lastErr = v.Problem
	}
	return state, "", lastErr
}

// oneLine is an error's first line, cut to lastErrorMax bytes on a rune
// boundary.
func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) <= lastErrorMax {
		return s
	}
	cut := lastErrorMax
	for cut > 0 && (s[cut]&0xC0) == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// round keeps a figure to 1/scale: microseconds of a lag, milliseconds of
// an age — finer is noise, and costs bytes on every row.
func round(x, scale float64) float64 { return math.Round(x*scale) / scale }
