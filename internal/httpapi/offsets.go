package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/store"
)

// offsetRoutes are the routes on a pipeline's progress and dead letters.
func (c *api) offsetRoutes() []route {
	return []route{
		{"GET", "/pipelines/{name}/offsets", accessRead, c.getOffsets},
		{"PATCH", "/pipelines/{name}/offsets", accessWrite, c.resetOffsets},
		{"GET", "/pipelines/{name}/dead-letters", accessRead, c.getDeadLetters},
		{"POST", "/pipelines/{name}/dead-letters/replay", accessWrite, c.replayDeadLetters},
		{"POST", "/pipelines/{name}/backfill", accessWrite, c.backfill},
	}
}

// sourceOf loads the pipeline's definition (the store's or the file's) to
// reach its source config.
func (c *api) sourceOf(v PipelineView) (*pipelines.Spec, *problem) {
	if v.ManagedBy == managedByFile {
		if spec := c.o.Control.Converger.Snapshot().Files[v.Name]; spec != nil {
			return spec, nil
		}
		return nil, &problem{code: http.StatusNotFound, msg: "pipeline " + v.Name + ": its file definition is not loaded"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	row, err := c.o.Control.Store.Pipeline(ctx, v.Name)
	if err != nil {
		return nil, storeProblem(err, "pipeline "+v.Name)
	}
	specs, err := c.o.Control.loader().LoadBytes("store:"+v.Name, []byte(row.Config))
	if err != nil || len(specs) != 1 {
		return nil, &problem{code: http.StatusUnprocessableEntity, msg: "the stored configuration of " + v.Name + " does not load here: " + redact.String(errString(err))}
	}
	// A tenant's pipeline its policy refuses (a policy narrowed since, a
	// pipeline stored before a rule) does not run, and its offsets, resets,
	// dead letters and backfills reach nothing either: they would dial
	// what the policy forbids, or move a slot that is another tenant's.
	if prob := c.checkPolicy(ctx, specs[0]); prob != nil {
		return nil, prob
	}
	return specs[0], nil
}

// OffsetsView is GET …/offsets.
type OffsetsView struct {
	Pipeline string `json:"pipeline"`
	Source   string `json:"source"`
	plugins.Offsets
}

func (c *api) getOffsets(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	k, ok := spec.Source.Config.(plugins.OffsetKeeper)
	if !ok {
		writeProblem(w, &problem{code: http.StatusUnprocessableEntity, msg: "the " + spec.Source.Type + " source keeps no offsets on a database"})
		return
	}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	off, err := k.Offsets(ctx, v.Name)
	if err != nil {
		writeProblem(w, &problem{code: http.StatusServiceUnavailable, msg: redact.String(err.Error())})
		return
	}
	writeJSON(w, http.StatusOK, OffsetsView{Pipeline: v.Name, Source: spec.Source.Type, Offsets: off})
}

// resetBody is PATCH …/offsets.
type resetBody struct {
	To       string          `json:"to"`
	Time     *string         `json:"time"`
	Position json.RawMessage `json:"position"`
}

func (b *resetBody) reset(dry bool, now time.Time) (plugins.OffsetReset, *problem) {
	bad := func(path, msg string) *problem {
		return &problem{code: http.StatusUnprocessableEntity, msg: path + ": " + msg, details: []detail{{Path: path, Message: msg}}}
	}
	out := plugins.OffsetReset{To: b.To, Position: b.Position, DryRun: dry}
	switch b.To {
	case plugins.ResetToTime:
		if b.Time == nil {
			return out, bad("time", `required with "to": "time" (RFC 3339, e.g. 2026-11-30T12:00:00Z)`)
		}
		t, err := time.Parse(time.RFC3339Nano, *b.Time)
		if err != nil {
			return out, bad("time", fmt.Sprintf("%q is not an RFC 3339 time", *b.Time))
		}
		if t.After(now) {
			return out, bad("time", fmt.Sprintf("%s is in the future", t.Format(time.RFC3339)))
		}
		out.Time = t
	case plugins.ResetToPosition, plugins.ResetToLatest:
	case "":
		return out, bad("to", "required: time, position or latest")
	default:
		return out, bad("to", fmt.Sprintf("must be time, position or latest, got %q", b.To))
	}
	if b.To != plugins.ResetToTime && b.Time != nil {
		return out, bad("time", `only with "to": "time"`)
	}
	if b.To != plugins.ResetToPosition && len(b.Position) > 0 {
		return out, bad("position", `only with "to": "position"`)
	}
	return out, nil
}

// stopped reports whether a pipeline in state s reads nothing.
func stopped(s engine.State) bool {
	switch s {
	case engine.StatePaused, engine.StateStopped, engine.StateFailed, StatePending, engine.StateStandby:
		return true
	}
	return false
}

// requirePaused refuses a change to a pipeline's progress unless it is
// paused and has stopped here, as Kafka Connect refuses offsets changes of
// a running connector. It waits a little for a pause just requested to
// take effect. With HA, the ownership lock is taken (and returned) so no
// instance starts it meanwhile.
func (c *api) requirePaused(ctx context.Context, v PipelineView, spec *pipelines.Spec) (func(), *problem) {
	if v.DesiredState != store.DesiredPaused {
		return nil, &problem{code: http.StatusConflict,
			msg: fmt.Sprintf("pipeline %s is %s: pause it first (POST /api/v1/pipelines/%s/pause); its progress can only change while it is stopped", v.Name, v.DesiredState, v.Name)}
	}
	// Wait for this instance to have stopped it, and for every instance's
	// last report (through the store) to say it runs nowhere.
	deadline := time.Now().Add(15 * time.Second)
	for {
		where := ""
		if st, err := c.o.Supervisor.Status(v.Name); err == nil && !stopped(st.State) {
			where = string(st.State) + " on this instance"
		}
		if where == "" {
			all, _ := c.views(ctx)
			for _, pv := range all {
				if pv.Name != v.Name {
					continue
				}
				for _, in := range pv.RunningOn {
					if !stopped(engine.State(in.State)) {
						where = in.State + " on instance " + in.Instance
					}
				}
			}
		}
		if where == "" {
			break
		}
		if time.Now().After(deadline) {
			return nil, &problem{code: http.StatusConflict, msg: fmt.Sprintf("pipeline %s is paused but still %s; retry once it stopped", v.Name, where)}
		}
		select {
		case <-ctx.Done():
			return nil, &problem{code: http.StatusConflict, msg: fmt.Sprintf("pipeline %s is paused but still %s; retry once it stopped", v.Name, where)}
		case <-time.After(100 * time.Millisecond):
		}
	}
	ha := plugins.SourceHA(spec.Source.Config)
	if !ha.Exclusive() {
		return func() {}, nil
	}
	if st, err := c.o.Supervisor.Status(v.Name); err == nil && st.State == engine.StatePaused {
		// Paused here and still known here: with HA this instance keeps the
		// ownership lock while paused, so no other instance can start it.
		return func() {}, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lock, err := waitForOwnership(lctx, ha.LockDSN, v.Name)
	if err != nil {
		return nil, &problem{code: http.StatusConflict, msg: redact.String(err.Error()) + "; retry once it stopped"}
	}
	return lock.Release, nil
}

// ResetView is PATCH …/offsets' answer.
type ResetView struct {
	Pipeline string `json:"pipeline"`
	Source   string `json:"source"`
	DryRun   bool   `json:"dry_run"`
	plugins.ResetResult
}

// changeRequest is the start of a request that changes a pipeline's
// progress (a reset, a backfill): the pipeline, writable by p; ?dry_run;
// the JSON body decoded strictly into body. On a problem it has answered,
// and ok is false.
func (c *api) changeRequest(w http.ResponseWriter, r *http.Request, p principal, body any) (v PipelineView, dry, ok bool) {
	v, ok = c.findWritable(w, r, p)
	if !ok {
		return v, false, false
	}
	dry, prob := boolQuery(r, "dry_run")
	if prob == nil {
		prob = decodeStrict(w, r, body)
	}
	if prob != nil {
		writeProblem(w, prob)
		return v, false, false
	}
	return v, dry, true
}

func (c *api) resetOffsets(w http.ResponseWriter, r *http.Request, p principal) {
	var body resetBody
	v, dry, ok := c.changeRequest(w, r, p, &body)
	if !ok {
		return
	}
	req, prob := body.reset(dry, time.Now())
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	k, ok := spec.Source.Config.(plugins.OffsetKeeper)
	if !ok {
		writeProblem(w, &problem{code: http.StatusUnprocessableEntity, msg: "the " + spec.Source.Type + " source keeps no offsets to reset"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	if !dry {
		release, prob := c.requirePaused(ctx, v, spec)
		if prob != nil {
			writeProblem(w, prob)
			return
		}
		defer release()
	}
	res, err := k.ResetOffsets(ctx, v.Name, req)
	if err != nil {
		writeProblem(w, requestProblem(err))
		return
	}
	if res.Applied && res.Resend > 0 {
		res.Note = strings.TrimPrefix(res.Note+"; ", "; ") + resetNote
	}
	if res.Applied {
		detail, _ := json.Marshal(map[string]any{"to": req.To, "from": res.From, "position": res.To, "resend_events": res.Resend, "skip_events": res.Skip})
		if err := c.record(ctx, p, store.ActionOffsetsReset, v, string(detail)); err != nil {
			// The reset happened; say that the record of it is missing.
			res.Note = strings.TrimPrefix(res.Note+"; ", "; ") + "the audit entry could not be written: " + redact.String(err.Error())
		}
		c.log().Warn("pipeline offsets reset", "pipeline", v.Name, "tenant", v.Tenant, "to", req.To, "from", res.From, "position", res.To,
			"resend_events", res.Resend, "skip_events", res.Skip, "token_id", p.actor.TokenID)
	}
	writeJSON(w, http.StatusOK, ResetView{Pipeline: v.Name, Source: spec.Source.Type, DryRun: dry, ResetResult: res})
}

// requestProblem maps a source's error: a RequestError is the caller's
// (422 naming the field), anything else the database's (503).
func requestProblem(err error) *problem {
	var re *plugins.RequestError
	if errors.As(err, &re) {
		return &problem{code: http.StatusUnprocessableEntity, msg: re.Error(), details: []detail{{Path: re.Field, Message: re.Msg}}}
	}
	return &problem{code: http.StatusServiceUnavailable, msg: redact.String(err.Error())}
}

func boolQuery(r *http.Request, key string) (bool, *problem) {
	s := r.URL.Query().Get(key)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, &problem{code: http.StatusBadRequest, msg: key + " must be true or false", details: []detail{{Path: key, Message: fmt.Sprintf("want true or false, got %q", s)}}}
	}
	return b, nil
}

func deadLetterFilter(r *http.Request) (plugins.DeadLetterFilter, *problem) {
	q := r.URL.Query()
	f := plugins.DeadLetterFilter{Reason: q.Get("reason")}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100000 {
			return f, &problem{code: http.StatusBadRequest, msg: "limit must be between 1 and 100000", details: []detail{{Path: "limit", Message: fmt.Sprintf("got %q", s)}}}
		}
		f.Limit = n
	}
	dry, prob := boolQuery(r, "dry_run")
	f.DryRun = dry
	return f, prob
}

// DeadLettersView is GET …/dead-letters.
type DeadLettersView struct {
	Pipeline    string               `json:"pipeline"`
	Source      string               `json:"source"`
	Total       int64                `json:"total"`
	DeadLetters []plugins.DeadLetter `json:"dead_letters"`
	// DeadLetterTopic is what the broker tells of the pipeline's
	// dead-letter topic, when it has one.
	DeadLetterTopic *plugins.DeadLetterTopicCount `json:"dead_letter_topic,omitempty"`
	Note            string                        `json:"note,omitempty"`
}

// countDeadLetterTopic asks the sink's broker about the pipeline's
// dead-letter topic; what it cannot tell is in the note.
func (c *api) countDeadLetterTopic(ctx context.Context, name string, spec *pipelines.Spec) *plugins.DeadLetterTopicCount {
	if spec.DeadLetter == nil {
		return nil
	}
	topic := spec.DeadLetter.Topic
	k, ok := spec.Sink.Config.(plugins.DeadLetterTopicKeeper)
	if !ok {
		return &plugins.DeadLetterTopicCount{Topic: topic,
			Note: "the " + spec.Sink.Type + " sink cannot read its dead-letter topic back here: count and replay them with the broker's tools"}
	}
	n, err := k.CountDeadLetterTopic(ctx, name, topic)
	if err != nil {
		return &plugins.DeadLetterTopicCount{Topic: topic, Note: "the broker could not be asked: " + redact.String(err.Error())}
	}
	return &n
}

func (c *api) getDeadLetters(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	f, prob := deadLetterFilter(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	out := DeadLettersView{Pipeline: v.Name, Source: spec.Source.Type, DeadLetters: []plugins.DeadLetter{}}
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	out.DeadLetterTopic = c.countDeadLetterTopic(c.tenantDial(ctx, tenantPipeline(v)), v.Name, spec)
	k, ok := spec.Source.Config.(plugins.DeadLetterKeeper)
	if !ok {
		out.Note = "the " + spec.Source.Type + " source parks no events; failed deliveries go to the sink's dead-letter destination when one is configured"
		if out.DeadLetterTopic != nil {
			out.Note = "the " + spec.Source.Type + " source parks no events; undeliverable events go to the dead-letter topic " + spec.DeadLetter.Topic + " (dead_letter_topic)"
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	list, total, err := k.DeadLetters(ctx, v.Name, f)
	if err != nil {
		writeProblem(w, requestProblem(err))
		return
	}
	out.Total = total
	if list != nil {
		out.DeadLetters = list
	}
	writeJSON(w, http.StatusOK, out)
}

// ReplayView is POST …/dead-letters/replay's answer.
type ReplayView struct {
	Pipeline string `json:"pipeline"`
	DryRun   bool   `json:"dry_run"`
	// Replayed counts both the source's unparked events and the dead
	// letters republished from the dead-letter topic.
	Replayed int `json:"replayed_events"`
	// IDs are the unparked events' outbox ids (poll).
	IDs []int64 `json:"outbox_ids"`
	// DeadLetterTopic is the replay of the pipeline's dead-letter topic.
	DeadLetterTopic *plugins.DeadLetterTopicReplay `json:"dead_letter_topic,omitempty"`
}

func (c *api) replayDeadLetters(w http.ResponseWriter, r *http.Request, p principal) {
	v, ok := c.findWritable(w, r, p)
	if !ok {
		return
	}
	f, prob := deadLetterFilter(r)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	k, parks := spec.Source.Config.(plugins.DeadLetterKeeper)
	dlq, readable := spec.Sink.Config.(plugins.DeadLetterTopicKeeper)
	readable = readable && spec.DeadLetter != nil
	if !parks && !readable {
		msg := "the " + spec.Source.Type + " source parks no events to replay"
		switch {
		case spec.DeadLetter == nil:
			msg += ", and the pipeline has no dead_letter topic"
		default:
			msg += ", and the " + spec.Sink.Type + " sink cannot read its dead-letter topic back: replay them with the broker's tools"
		}
		writeProblem(w, &problem{code: http.StatusUnprocessableEntity, msg: msg})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 120*time.Second)
	defer cancel()
	view := ReplayView{Pipeline: v.Name, DryRun: f.DryRun, IDs: []int64{}}
	if parks {
		ids, err := k.ReplayDeadLetters(ctx, v.Name, f)
		if err != nil {
			writeProblem(w, requestProblem(err))
			return
		}
		if ids != nil {
			view.IDs = ids
		}
		view.Replayed = len(ids)
	}
	if readable {
		if v.Tenant != "" && v.ManagedBy == managedByAPI {
			// A replay publishes as the pipeline does: only where the
			// tenant's policy allows (the dead letter's destination header
			// is whatever the event carried).
			f.Allowed = c.o.Control.Converger.TenantPolicy(v.Tenant).AllowsDestination
		}
		res, err := dlq.ReplayDeadLetterTopic(c.tenantDial(ctx, tenantPipeline(v)), v.Name, spec.DeadLetter.Topic, f)
		if res.Replayed > 0 && !f.DryRun {
			c.auditReplay(ctx, p, v, f, fmt.Sprintf("%d dead letters republished from topic %s (reason %q, limit %d)", res.Replayed, res.Topic, f.Reason, f.Limit))
		}
		if err != nil {
			writeProblem(w, &problem{code: http.StatusServiceUnavailable,
				msg: fmt.Sprintf("dead-letter topic %s: %d replayed, then: %s", spec.DeadLetter.Topic, res.Replayed, redact.String(err.Error()))})
			return
		}
		view.DeadLetterTopic = &res
		view.Replayed += res.Replayed
	}
	if !f.DryRun && len(view.IDs) > 0 {
		c.auditReplay(ctx, p, v, f, fmt.Sprintf("%d dead letters replayed (reason %q, limit %d)", len(view.IDs), f.Reason, f.Limit))
	}
	writeJSON(w, http.StatusOK, view)
}

// record writes an operation on a pipeline's progress to the audit log.
// Without a store there is none: the log line each caller writes is the
// record.
func (c *api) record(ctx context.Context, p principal, action string, v PipelineView, detail string) error {
	if c.o.Control.Store == nil {
		return nil
	}
	return c.o.Control.Store.Record(ctx, p.actor, action, v.Name, v.Tenant, detail)
}

// auditReplay records a dead-letter replay and logs it.
func (c *api) auditReplay(ctx context.Context, p principal, v PipelineView, f plugins.DeadLetterFilter, detail string) {
	if err := c.record(ctx, p, store.ActionDeadLetterReplay, v, detail); err != nil {
		c.log().Error("audit a dead-letter replay", "pipeline", v.Name, "tenant", v.Tenant, "err", redact.Error(err))
	}
	c.log().Info("dead letters replayed", "pipeline", v.Name, "tenant", v.Tenant, "detail", detail, "reason", f.Reason, "token_id", p.actor.TokenID)
}

// backfillBody is POST …/backfill.
type backfillBody struct {
	From          *string `json:"from"`
	To            *string `json:"to"`
	AggregateType string  `json:"aggregate_type"`
	AggregateID   string  `json:"aggregate_id"`
	Type          string  `json:"type"`
}

func (b *backfillBody) filter(dry bool, now time.Time) (plugins.BackfillFilter, *problem) {
	bad := func(path, msg string) *problem {
		return &problem{code: http.StatusUnprocessableEntity, msg: path + ": " + msg, details: []detail{{Path: path, Message: msg}}}
	}
	f := plugins.BackfillFilter{AggregateType: b.AggregateType, AggregateID: b.AggregateID, Type: b.Type, DryRun: dry}
	for _, t := range []struct {
		path string
		src  *string
		dst  **time.Time
	}{{"from", b.From, &f.From}, {"to", b.To, &f.To}} {
		if t.src == nil {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, *t.src)
		if err != nil {
			return f, bad(t.path, fmt.Sprintf("%q is not an RFC 3339 time", *t.src))
		}
		if v.After(now) {
			return f, bad(t.path, fmt.Sprintf("%s is in the future", v.Format(time.RFC3339)))
		}
		*t.dst = &v
	}
	if f.From != nil && f.To != nil && !f.From.Before(*f.To) {
		return f, bad("to", "must be after from")
	}
	if f.From == nil && f.To == nil && f.AggregateType == "" && f.AggregateID == "" && f.Type == "" {
		return f, bad("", "give a time range (from, to) or a filter (aggregate_type, aggregate_id, type)")
	}
	return f, nil
}

// BackfillView is POST …/backfill's answer.
type BackfillView struct {
	Pipeline string `json:"pipeline"`
	DryRun   bool   `json:"dry_run"`
	Events   int64  `json:"backfill_events"`
	// Note says what the count is: queued, not yet sent or stored.
	Note string `json:"note,omitempty"`
}

// resetNote is what a reset's answer cannot say of the events it re-sends.
const resetNote = "the re-sent events go out when the pipeline resumes, each with a broker message id naming this reset " +
	"(NATS: Nats-Msg-Id <event id>:reset-<id>) where the source can mark them; what a broker still answers as a duplicate " +
	"is counted in the pipeline's duplicates_total (NATS; Kafka and RabbitMQ do not tell)"

// backfillNote is what a backfill's answer cannot say: the running
// pipeline sends the events after it, so what the broker stored is not
// known yet; it says where to look for what the broker did not store.
const backfillNote = "queued: the running pipeline sends them beside live traffic after this answer; " +
	"each carries a broker message id of its own request (NATS: Nats-Msg-Id <event id>:backfill-<id>) so the broker's deduplication " +
	"does not drop it, and the event id stays in its headers; what a broker still answers as a duplicate is counted in the " +
	"pipeline's duplicates_total (NATS; Kafka and RabbitMQ do not tell)"

func (c *api) backfill(w http.ResponseWriter, r *http.Request, p principal) {
	var body backfillBody
	v, dry, ok := c.changeRequest(w, r, p, &body)
	if !ok {
		return
	}
	f, prob := body.filter(dry, time.Now())
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, prob)
		return
	}
	b, ok := spec.Source.Config.(plugins.Backfiller)
	if !ok {
		writeProblem(w, &problem{code: http.StatusUnprocessableEntity,
			msg: "the " + spec.Source.Type + " source cannot backfill beside live traffic; pause the pipeline and reset its offsets to a time instead (PATCH /api/v1/pipelines/" + v.Name + "/offsets)"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	n, err := b.Backfill(ctx, v.Name, f)
	if err != nil {
		writeProblem(w, requestProblem(err))
		return
	}
	if !dry {
		detail, _ := json.Marshal(map[string]any{"filter": body, "backfill_events": n})
		if err := c.record(ctx, p, store.ActionBackfill, v, string(detail)); err != nil {
			c.log().Error("audit a backfill", "pipeline", v.Name, "tenant", v.Tenant, "err", redact.Error(err))
		}
		c.log().Info("backfill queued", "pipeline", v.Name, "tenant", v.Tenant, "events", n, "token_id", p.actor.TokenID)
	}
	view := BackfillView{Pipeline: v.Name, DryRun: dry, Events: n}
	if !dry && n > 0 {
		view.Note = backfillNote
	}
	writeJSON(w, http.StatusOK, view)
}
