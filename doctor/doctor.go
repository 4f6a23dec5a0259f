// Package doctor is the on-call runbook as code. For each pipeline it
// measures the symptom — how old is the oldest undelivered event — and then
// walks the path an event takes, stopping at the first stage that is
// unhealthy: the relay, the source position, the broker, the consumers. Each
// finding carries its evidence and the next thing to do.
//
// It owns the diagnosis only: pipelines builds the components, and what a
// stage can be asked (Prober, Pinger, ConsumerLagger, a source's Details)
// comes from the plugins capabilities. It must not import any component
// (sources/, transforms/, sinks/), the CLI, the HTTP API or a lab package; it reads a
// running Ferry over its HTTP API, as any client would.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// Stages, in the order the doctor walks them. StageCoordination is the
// instance's, checked before any pipeline's.
const (
	StageCoordination = "coordination"
	StageStore        = "store"
	StageBacklog      = "backlog"
	StageRelay        = "relay"
	StageSource       = "source"
	StageBroker       = "broker"
	StageConsumer     = "consumer"
)

// Verdicts of one check.
const (
	OK        = "ok"
	Unhealthy = "unhealthy"
	Unknown   = "unknown" // could not check
	Skipped   = "n/a"     // nothing to check for this pipeline
)

// Options tune the checks.
type Options struct {
	// URL of a running Ferry's HTTP listener; when set, the relay check reads
	// the pipeline's state there, and the instance's coordination database
	// is checked first. Without it, the doctor looks for the relay's session
	// on the source database.
	URL string
	// URLIsDefault says URL was not asked for: when nothing answers there,
	// the doctor checks as if there were no URL.
	URLIsDefault bool
	// Local, when set, is the running Ferry the doctor runs inside (the
	// API's and the console's walk): the relay is judged by the pipeline's
	// status there, as with URL. Without it, a walk inside an instance
	// would look for sessions on the source database, where the instance's
	// own pool (it measures a paused pipeline's backlog too) passes for a
	// relay.
	Local func(name string) (engine.Status, error)
	// Token is sent as the bearer token to URL: once an instance has any
	// API token, every /api/v1 read needs one.
	Token string
	// MaxAge is the oldest undelivered event age that counts as unhealthy.
	// Default 1m.
	MaxAge time.Duration
	// MaxTransactionAge is how old the oldest running transaction may be
	// before it counts as blocking (xid8). Default 5m.
	MaxTransactionAge time.Duration
	// MaxConsumerLag is how many unconsumed messages count as behind.
	// Default 1000.
	MaxConsumerLag int64
	// Sample is the gap between two backlog measurements, to see growth.
	// Default 2s; 0 measures once.
	Sample time.Duration
	// Timeout bounds each check. Default 10s.
	Timeout time.Duration
	// Destinations, when set, are the topics the consumer stage may report
	// lag on (a tenant's policy's AllowsDestination): a Kafka group of the
	// tenant's may have committed offsets on another tenant's topics, whose
	// end offsets are that tenant's to know. Nil reports every topic.
	Destinations func(topic string) bool
	// Registry builds the components; nil means plugins.Default.
	Registry *plugins.Registry
	// Logger is what the components the doctor builds log to; nil
	// discards their lines, so the report is all the doctor prints (a
	// sink saying it connected is the broker check's evidence already).
	Logger *slog.Logger

	instance    *instance // what URL answered
	instanceErr error     // why it did not
}

func (o *Options) defaults() {
	if o.MaxAge == 0 {
		o.MaxAge = time.Minute
	}
	if o.MaxTransactionAge == 0 {
		o.MaxTransactionAge = 5 * time.Minute
	}
	if o.MaxConsumerLag == 0 {
		o.MaxConsumerLag = 1000
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Check is one stage's verdict.
type Check struct {
	Stage    string   `json:"stage"`
	Status   string   `json:"status"`
	Evidence []string `json:"evidence,omitempty"`
	Action   string   `json:"action,omitempty"`
}

// Diagnosis is one pipeline's walk: the checks up to and including the
// first unhealthy one.
type Diagnosis struct {
	Pipeline string  `json:"pipeline"`
	Tenant   string  `json:"tenant,omitempty"`
	Healthy  bool    `json:"healthy"`
	Stage    string  `json:"stage,omitempty"` // the first unhealthy stage
	Checks   []Check `json:"checks"`
}

// Report is the doctor's answer for the instance and every pipeline.
type Report struct {
	// Coordination is the instance's coordination database (high
	// availability), when the doctor asked a running Ferry.
	Coordination *Check `json:"coordination,omitempty"`
	// Store is the instance's control-plane store, when the doctor asked
	// a running Ferry that has one (--store).
	Store     *Check      `json:"store,omitempty"`
	Pipelines []Diagnosis `json:"pipelines"`
}

// ExitCode is 0 when every pipeline is healthy, 1 when one is not (or the
// coordination database is unreachable), 2 when something could not be
// checked (and nothing was found unhealthy).
func (r Report) ExitCode() int {
	for _, c := range []*Check{r.Coordination, r.Store} {
		if c != nil && c.Status == Unhealthy {
			return 1
		}
	}
	code := 0
	for _, d := range r.Pipelines {
		if d.Stage != "" {
			return 1
		}
		for _, c := range d.Checks {
			if c.Status == Unknown {
				code = 2
			}
		}
	}
	return code
}

// Run diagnoses the instance at URL (its coordination database) and every
// pipeline.
func Run(ctx context.Context, specs []*pipelines.Spec, o Options) Report {
	o.defaults()
	var r Report
	if o.URL != "" {
		fctx, cancel := context.WithTimeout(ctx, o.Timeout)
		inst, err := fetchInstance(fctx, o.URL, o.Token)
		cancel()
		var netErr *url.Error
		switch {
		case err != nil && o.URLIsDefault && errors.As(err, &netErr):
			o.URL = "" // nothing runs at the default address: look at the databases
		case err != nil:
			o.instanceErr = err
		default:
			o.instance = inst
			r.Coordination = checkCoordination(inst.Coordination)
			r.Store = checkStore(inst.Store)
		}
	}
	for _, s := range specs {
		r.Pipelines = append(r.Pipelines, diagnose(ctx, s, o))
	}
	return r
}

// checkCoordination judges the instance's coordination database: while it
// is unreachable, every pipeline may look fine and HA still runs degraded.
func checkCoordination(c *engine.Coordination) *Check {
	if c == nil {
		return nil // no high availability
	}
	ch := &Check{Stage: StageCoordination, Status: OK, Evidence: []string{fmt.Sprintf("coordination database %s (%s): up, %d live instance(s)", c.Database, c.From, c.LiveInstances)}}
	if !c.Up {
		ch.Status = Unhealthy
		ch.Evidence = []string{fmt.Sprintf("coordination database %s (%s) unreachable since %s: %s", c.Database, c.From, c.Since.Format(time.RFC3339), c.LastError),
			"instance " + c.Instance + " " + c.Degraded}
		ch.Action = "make the coordination database reachable (or point --coordination-dsn at one that is); until then pipelines are not shared fairly"
	}
	return ch
}

func diagnose(ctx context.Context, spec *pipelines.Spec, o Options) Diagnosis {
	d := Diagnosis{Pipeline: spec.Name, Tenant: spec.Tenant}
	// Its own sessions named apart from a relay's ferry:pool, which the
	// relay stage looks for.
	p, err := engine.Build(spec, plugins.Env{PoolName: "ferry:doctor", Logger: o.Logger})
	if err != nil {
		d.Checks = append(d.Checks, Check{Stage: StageBacklog, Status: Unknown, Evidence: []string{err.Error()}})
		return d
	}
	defer p.Close()

	backlog, health, err := checkBacklog(ctx, p, o)
	if pg, ok := denied(err); ok {
		// The source's role may not read its table: nothing after this
		// can work, and the database said exactly why.
		d.Checks = append(d.Checks, backlog, checkPrivileges(ctx, spec, pg, o))
		d.Stage = StageSource
		return d
	}
	relay, suspect := checkRelay(ctx, spec, o)
	d.Checks = append(d.Checks, backlog, relay)
	if relay.Status == Unhealthy {
		d.Stage = StageRelay
		if health != nil && health.Details["slot"] != nil {
			// A paused or stopped wal pipeline's slot still retains WAL for
			// the whole server: say how much, whatever stopped the relay.
			d.Checks = append(d.Checks, checkSource(health, o))
		}
		return d
	}
	checks := []func() Check{
		func() Check { return checkSource(health, o) },
		func() Check { return checkBroker(ctx, p, o) },
		func() Check { return checkConsumers(ctx, p, o) },
	}
	for _, c := range checks {
		ch := c()
		d.Checks = append(d.Checks, ch)
		if ch.Status == Unhealthy {
			d.Stage = ch.Stage
			return d
		}
	}
	if suspect != "" {
		// The relay runs but says it fails or stalls, and no stage after it
		// explains why: the relay itself is the place to look.
		d.Checks[1].Status, d.Checks[1].Action = Unhealthy, suspect
		d.Stage = StageRelay
		return d
	}
	if backlog.Status == Unhealthy {
		// Every stage works, yet events age: the relay cannot keep up.
		d.Stage = StageBacklog
		return d
	}
	d.Healthy = backlog.Status == OK
	return d
}

// checkBacklog measures the oldest undelivered event, twice, Sample apart;
// err is why it could not.
func checkBacklog(ctx context.Context, p *engine.Pipeline, o Options) (Check, *plugins.Health, error) {
	c := Check{Stage: StageBacklog}
	pr, ok := p.Source.(plugins.Prober)
	if !ok {
		c.Status = Skipped
		c.Evidence = []string{fmt.Sprintf("the %s source cannot be measured", p.Spec.Source.Type)}
		return c, nil, nil
	}
	probe := func() (plugins.Health, error) {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		return pr.Probe(ctx)
	}
	h, err := probe()
	if pg, ok := denied(err); ok {
		// The wrapping may guess at the cause (a missing column); the
		// SQLSTATE is what happened, and the source check names it.
		c.Status, c.Evidence = Unknown, []string{"cannot measure the backlog: permission denied (" + redact.String(pg.Message) + ")"}
		return c, nil, err
	}
	if err != nil {
		c.Status, c.Evidence = Unknown, []string{"cannot measure the backlog: " + redact.String(err.Error())}
		c.Action = "check that the source database is reachable with the pipeline's dsn"
		return c, nil, err
	}
	c.Evidence = append(c.Evidence, fmt.Sprintf("backlog %d %s, oldest undelivered %s (budget %s)", h.Backlog, h.BacklogUnit, h.OldestAge.Round(time.Millisecond), o.MaxAge))
	if o.Sample > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(o.Sample):
		}
		if h2, err := probe(); err == nil {
			c.Evidence = append(c.Evidence, fmt.Sprintf("%s later: backlog %d (%+d)", o.Sample, h2.Backlog, h2.Backlog-h.Backlog))
			h = h2
		}
	}
	c.Status = OK
	if h.OldestAge > o.MaxAge {
		c.Status = Unhealthy
		c.Action = "events are ageing: the stages below say why"
	}
	return c, &h, nil
}

// instance is what a running Ferry says about itself.
type instance struct {
	Pipelines    []engine.Status      `json:"pipelines"`
	Coordination *engine.Coordination `json:"coordination"`
	Store        *storeState          `json:"store"`
}

// storeState is GET /api/v1/pipelines's store: the control-plane store as
// the instance last found it.
type storeState struct {
	Up        bool       `json:"up"`
	ReadAt    *time.Time `json:"read_at"`
	Since     *time.Time `json:"since"`
	LastError string     `json:"last_error"`
}

// checkStore judges the instance's control-plane store: while it is
// unreachable the pipelines run as last read and no change can be made,
// which every pipeline's own checks would not show.
func checkStore(s *storeState) *Check {
	if s == nil {
		return nil // no store
	}
	if s.Up {
		return &Check{Stage: StageStore, Status: OK, Evidence: []string{"the control-plane store answers"}}
	}
	since, last := "this instance's start", "never"
	if s.Since != nil {
		since = s.Since.Format(time.RFC3339)
	}
	if s.ReadAt != nil {
		last = s.ReadAt.Format(time.RFC3339)
	}
	return &Check{Stage: StageStore, Status: Unhealthy,
		Evidence: []string{fmt.Sprintf("the control-plane store is unreachable since %s: %s", since, redact.String(s.LastError)),
			"pipelines run as last read (at " + last + "); creates, updates, pauses and deletes are refused until it answers"},
		Action: "make the store's database reachable (the --store DSN); nothing needs restarting: instances read it again on their own"}
}

func fetchInstance(ctx context.Context, base, token string) (*instance, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/api/v1/pipelines", nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var body instance
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	return &body, nil
}

// status is the pipeline's status as the instance at URL reported it.
func (o *Options) status(name string) (engine.Status, error) {
	if o.Local != nil {
		return o.Local(name)
	}
	if o.instanceErr != nil {
		return engine.Status{}, o.instanceErr
	}
	for _, s := range o.instance.Pipelines {
		if s.Name == name {
			return s, nil
		}
	}
	return engine.Status{}, fmt.Errorf("that Ferry does not run pipeline %q", name)
}

// checkSource looks at what holds the source's position back: the oldest
// running transaction (xid8), a replication slot (wal).
func checkSource(h *plugins.Health, o Options) Check {
	c := Check{Stage: StageSource}
	if h == nil {
		c.Status = Skipped
		return c
	}
	c.Status = OK
	if slot, ok := h.Details["slot"].(string); ok {
		return checkSlot(c, slot, h.Details)
	}
	if h.XminHorizonAge() > 0 {
		c.Evidence = append(c.Evidence, fmt.Sprintf("oldest running transaction %s old (limit %s)", h.XminHorizonAge().Round(time.Second), o.MaxTransactionAge))
	}
	if tx, ok := h.Details["oldest_transaction"].(map[string]any); ok && h.XminHorizonAge() > o.MaxTransactionAge {
		c.Status = Unhealthy
		c.Evidence = append(c.Evidence, fmt.Sprintf("pid %v (user %v, application %q, database %v) in state %q, transaction started %v, last query: %v",
			tx["pid"], tx["user"], tx["application"], tx["database"], tx["state"], tx["xact_start"], tx["query"]))
		c.Action = fmt.Sprintf("that transaction holds every xid8 cursor on the server: end it (COMMIT/ROLLBACK in its session, or SELECT pg_terminate_backend(%v))", tx["pid"])
	}
	return c
}

// checkSlot judges a replication slot from the details the wal source
// reports: it exists, is active, and its retained WAL is not about to
// invalidate it.
func checkSlot(c Check, slot string, d map[string]any) Check {
	if d["slot_exists"] == false {
		c.Status = Unhealthy
		c.Evidence = append(c.Evidence, fmt.Sprintf("slot %s does not exist", slot))
		c.Action = "the pipeline never ran here, or its slot was dropped: events committed since may be missing — see the WAL source's 'slot lost' steps in the README"
		return c
	}
	safe := d["safe_wal_size_bytes"]
	if safe == nil {
		safe = "unlimited (max_slot_wal_keep_size -1)" // the server reports no bound
	}
	c.Evidence = append(c.Evidence, fmt.Sprintf("slot %s: active %v, wal_status %v, retained %v bytes of WAL, confirmed up to %v, safe_wal_size %v",
		slot, d["active"], d["wal_status"], d["retained_wal_bytes"], d["confirmed_lsn"], safe))
	if behind, ok := d["member_behind_bytes"]; ok {
		// A shared slot is held back to its furthest-behind member.
		c.Evidence = append(c.Evidence, fmt.Sprintf("this pipeline's position in the shared slot is %v bytes of WAL behind, which the slot retains for it", behind))
	}
	switch {
	case d["wal_status"] == "lost":
		c.Status = Unhealthy
		c.Action = "the slot was invalidated: events may have been missed; see the WAL source's 'slot lost' steps in the README"
	case d["active"] == false && d["shared"] == true:
		// Dropping it would lose every member's place, not this one's.
		c.Status = Unhealthy
		c.Action = fmt.Sprintf("no relay reads the shared slot %s and it retains WAL for every pipeline that shares it: start them; "+
			"a pipeline that is gone leaves it with ferry pipelines delete (its row in ferry_wal_members goes)", slot)
	case d["active"] == false:
		c.Status = Unhealthy
		c.Action = fmt.Sprintf("no relay reads slot %s and it retains WAL: start the pipeline, or drop the slot if the pipeline is gone (SELECT pg_drop_replication_slot('%s'))", slot, slot)
	case d["wal_status"] == "unreserved":
		c.Status = Unhealthy
		c.Action = "the slot is about to be invalidated (past max_slot_wal_keep_size): the relay must catch up now"
	}
	return c
}

// checkBroker connects the sink and checks the broker answers.
func checkBroker(ctx context.Context, p *engine.Pipeline, o Options) Check {
	c := Check{Stage: StageBroker}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if err := p.Sink.Start(ctx); err != nil {
		c.Status, c.Evidence = Unhealthy, []string{"cannot connect: " + redact.String(err.Error())}
		c.Action = "check the broker is up and reachable with the sink's settings"
		return c
	}
	pg, ok := p.Sink.(plugins.Pinger)
	if !ok {
		c.Status, c.Evidence = OK, []string{"connected"}
		return c
	}
	if err := pg.Ping(ctx); err != nil {
		c.Status, c.Evidence = Unhealthy, []string{"the broker does not answer: " + redact.String(err.Error())}
		c.Action = "check the broker is up and reachable with the sink's settings"
		return c
	}
	c.Status, c.Evidence = OK, []string{"the broker answers"}
	return c
}

// checkConsumers asks the broker how far the consumers named in the sink's
// config are behind.
func checkConsumers(ctx context.Context, p *engine.Pipeline, o Options) Check {
	c := Check{Stage: StageConsumer}
	cl, ok := p.Sink.(plugins.ConsumerLagger)
	if !ok {
		c.Status = Skipped
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	lags, err := cl.ConsumerLag(ctx)
	if err != nil {
		c.Status, c.Evidence = Unknown, []string{"cannot read consumer lag: " + redact.String(err.Error())}
		return c
	}
	if o.Destinations != nil {
		lags = slices.DeleteFunc(lags, func(l plugins.GroupLag) bool { return !o.Destinations(l.Topic) })
	}
	if len(lags) == 0 {
		c.Status = Skipped
		return c
	}
	c.Status = OK
	for _, l := range lags {
		c.Evidence = append(c.Evidence, fmt.Sprintf("group %s on %s: %d behind", l.Group, l.Topic, l.Lag))
		if l.Lag > o.MaxConsumerLag {
			c.Status = Unhealthy
			c.Action = fmt.Sprintf("the consumers of group %s are behind: Ferry delivered, they did not consume — scale or fix them", l.Group)
		}
	}
	return c
}

// Print writes the report for people: the instance's coordination
// database first, then per pipeline, each check walked.
func (r Report) Print(w io.Writer) {
	if c := r.Coordination; c != nil {
		fmt.Fprintf(w, "instance: coordination %s\n", c.Status)
		for _, e := range c.Evidence {
			fmt.Fprintf(w, "       %s\n", e)
		}
		if c.Action != "" && c.Status != OK {
			fmt.Fprintf(w, "       → %s\n", c.Action)
		}
	}
	if c := r.Store; c != nil && c.Status != OK {
		fmt.Fprintf(w, "instance: store %s\n", c.Status)
		for _, e := range c.Evidence {
			fmt.Fprintf(w, "       %s\n", e)
		}
		fmt.Fprintf(w, "       → %s\n", c.Action)
	}
	for _, d := range r.Pipelines {
		verdict := "healthy"
		if d.Stage != "" {
			verdict = "UNHEALTHY at " + d.Stage
		} else if !d.Healthy {
			verdict = "could not check everything"
		}
		fmt.Fprintf(w, "%s: %s\n", d.Pipeline, verdict)
		for i, c := range d.Checks {
			fmt.Fprintf(w, "  %d. %-8s %s\n", i+1, c.Stage, c.Status)
			for _, e := range c.Evidence {
				fmt.Fprintf(w, "       %s\n", e)
			}
			if c.Action != "" && c.Status != OK {
				fmt.Fprintf(w, "       → %s\n", c.Action)
			}
		}
	}
}
