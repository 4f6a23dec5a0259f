package bench

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/sinks/kafka"
	"github.com/ferryhq/ferry/sinks/nats"
	"github.com/ferryhq/ferry/sinks/rabbitmq"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

// Report is a bench run: every measurement, the rows they summarise into
// (ratios to the baselines measured in the same repeat), and the targets.
type Report struct {
	Command      string        `json:"command,omitempty"`
	Started      time.Time     `json:"started"`
	Finished     time.Time     `json:"finished"`
	Machine      Machine       `json:"machine"`
	Services     []string      `json:"services"`
	LoadBefore   string        `json:"load_before,omitempty"`
	LoadAfter    string        `json:"load_after,omitempty"`
	Options      ReportOptions `json:"options"`
	Measurements []Measurement `json:"measurements"`
	Rows         []Row         `json:"rows"`
	Targets      []Target      `json:"targets"`
	Failures     []string      `json:"failures,omitempty"`
}

// Machine is where the bench ran.
type Machine struct {
	CPU        string `json:"cpu,omitempty"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	OS         string `json:"os"`
}

// ReportOptions are the sizes the run used.
type ReportOptions struct {
	Events        int      `json:"events"`
	Rate          int      `json:"rate"`
	Duration      string   `json:"duration"`
	Writers       int      `json:"writers"`
	MemoryEvents  []int    `json:"memory_events"`
	IdlePipelines []int    `json:"idle_pipelines"`
	IdleDuration  string   `json:"idle_duration"`
	Repeat        int      `json:"repeat"`
	Set           []string `json:"set,omitempty"`
}

func reportOptions(o Options) ReportOptions {
	return ReportOptions{Events: o.Events, Rate: o.Rate, Duration: o.Duration.String(), Writers: o.Writers,
		MemoryEvents: o.MemoryEvents, IdlePipelines: o.IdlePipelines, IdleDuration: o.IdleDuration.String(),
		Repeat: o.Repeat, Set: o.Set}
}

// Measurement is one run of one system.
type Measurement struct {
	Scenario string `json:"scenario"`
	System   string `json:"system"`
	Source   string `json:"source,omitempty"`
	Sink     string `json:"sink"`
	Repeat   int    `json:"repeat"`
	// Baseline is the watermill-sql build (system watermill-sql).
	Baseline string `json:"baseline,omitempty"`
	// Events measured (drain: the backlog; steady: written in the window).
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec,omitempty"`
	// CPUSeconds the system's process used for the events (drain: from
	// start to the last ack; steady: its share of the window; idle: over
	// the window).
	CPUSeconds float64 `json:"cpu_seconds"`
	// PGCPUSeconds is the CPU the PostgreSQL backends serving the system
	// used over the same window, PGBackends how many (drain and
	// backlog-memory, with the server on this machine; see pgCPU).
	PGCPUSeconds float64  `json:"pg_cpu_seconds,omitempty"`
	PGBackends   int      `json:"pg_backends,omitempty"`
	PeakRSS      int64    `json:"peak_rss_bytes,omitempty"`
	Latency      *Latency `json:"latency,omitempty"`
	Idle         *Idle    `json:"idle,omitempty"`
	Pipelines    int      `json:"pipelines,omitempty"`
	// Delivery check: how (ids read back, or the broker's count), and what.
	Verified   string `json:"verified,omitempty"`
	Delivered  int    `json:"delivered"`
	Missing    int    `json:"missing"`
	Duplicates int    `json:"duplicates"`
	Note       string `json:"note,omitempty"`
}

// Latency is a distribution in milliseconds.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Idle is what idle pipelines cost.
type Idle struct {
	CPUPercent float64 `json:"cpu_percent_of_one_core"`
	// XactPerSec are the transactions per second the database committed
	// or rolled back (pg_stat_database), each query outside a transaction
	// block being one.
	XactPerSec float64 `json:"xact_per_sec"`
	RowsPerSec float64 `json:"rows_returned_per_sec"`
	// Connections are the most server sessions Ferry held (pg_stat_activity,
	// application_name ferry:…) from its start to the window's end, sampled
	// every 250ms.
	Connections int64 `json:"server_connections"`
	// BrokerConnections are the established TCP connections the process
	// held to the sink's brokers at the end of the window.
	BrokerConnections int64 `json:"broker_connections"`
	// StartSeconds is how long the process took from its start until every
	// pipeline was running.
	StartSeconds float64 `json:"start_seconds"`
}

func latencies(ns []int64) *Latency {
	if len(ns) == 0 {
		return nil
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(i, 0)]) / 1e6
	}
	return &Latency{Count: len(s), P50: q(0.50), P95: q(0.95), P99: q(0.99), Max: float64(s[len(s)-1]) / 1e6}
}

func (m Measurement) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s:", m.Scenario, m.System, arrow(m.Source, m.Sink))
	switch {
	case m.Idle != nil:
		fmt.Fprintf(&b, " %d pipelines, started in %.1fs, %.2f%% of a core, %.1f xact/s, %d server connections, %d broker connections, peak RSS %s",
			m.Pipelines, m.Idle.StartSeconds, m.Idle.CPUPercent, m.Idle.XactPerSec, m.Idle.Connections, m.Idle.BrokerConnections, mb(m.PeakRSS))
	default:
		fmt.Fprintf(&b, " %d events in %.2fs = %.0f events/s", m.Events, m.Seconds, m.EventsPerSec)
		if m.Latency != nil {
			fmt.Fprintf(&b, ", p50 %.1fms p99 %.1fms max %.1fms", m.Latency.P50, m.Latency.P99, m.Latency.Max)
		}
		if m.Events > 0 {
			fmt.Fprintf(&b, ", %.1f CPU µs/event", m.CPUSeconds/float64(m.Events)*1e6)
			if m.PGBackends > 0 {
				fmt.Fprintf(&b, " + PostgreSQL %.1f µs/event (%d backends)", m.PGCPUSeconds/float64(m.Events)*1e6, m.PGBackends)
			}
		}
		if m.PeakRSS > 0 {
			fmt.Fprintf(&b, ", peak RSS %s", mb(m.PeakRSS))
		}
	}
	if m.Verified != "" {
		fmt.Fprintf(&b, "; delivered %d/%d (%s)", m.Delivered, m.Delivered+m.Missing, m.Verified)
		if m.Duplicates > 0 {
			fmt.Fprintf(&b, ", %d duplicates", m.Duplicates)
		}
	}
	if m.Note != "" {
		b.WriteString("; " + m.Note)
	}
	return b.String()
}

func mb(b int64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f MB", float64(b)/(1<<20))
}

// Row summarises the repeats of one system in one scenario.
type Row struct {
	Scenario string `json:"scenario"`
	System   string `json:"system"`
	Source   string `json:"source,omitempty"`
	Sink     string `json:"sink"`
	Runs     int    `json:"runs"`
	Events   int    `json:"events"`
	// Medians over the repeats, with the range.
	EventsPerSec    float64 `json:"events_per_sec,omitempty"`
	EventsPerSecMin float64 `json:"events_per_sec_min,omitempty"`
	EventsPerSecMax float64 `json:"events_per_sec_max,omitempty"`
	// VsWatermill is events/s ÷ the watermill-sql baseline's into the same
	// sink in the same repeat; OfCeiling ÷ the ceiling's, in percent.
	VsWatermill    float64 `json:"x_watermill_sql,omitempty"`
	VsWatermillMin float64 `json:"x_watermill_sql_min,omitempty"`
	VsWatermillMax float64 `json:"x_watermill_sql_max,omitempty"`
	OfCeiling      float64 `json:"pct_of_ceiling,omitempty"`
	OfCeilingMin   float64 `json:"pct_of_ceiling_min,omitempty"`
	OfCeilingMax   float64 `json:"pct_of_ceiling_max,omitempty"`
	// OfFranzCeiling is events/s ÷ Kafka's franz-go ceiling's in the same
	// repeat, in percent; CPUVsCeiling Ferry's CPU per event ÷ the
	// ceiling's (both drain only).
	OfFranzCeiling    float64 `json:"pct_of_franz_go_ceiling,omitempty"`
	OfFranzCeilingMin float64 `json:"pct_of_franz_go_ceiling_min,omitempty"`
	OfFranzCeilingMax float64 `json:"pct_of_franz_go_ceiling_max,omitempty"`
	CPUVsCeiling      float64 `json:"cpu_x_ceiling,omitempty"`
	CPUVsCeilingMin   float64 `json:"cpu_x_ceiling_min,omitempty"`
	CPUVsCeilingMax   float64 `json:"cpu_x_ceiling_max,omitempty"`
	// Latency of the repeat with the median p99; P99Max is the worst p99.
	Latency *Latency `json:"latency,omitempty"`
	P99Max  float64  `json:"p99_max_ms,omitempty"`
	// CPUPer10k is CPU-seconds per 10,000 events (median); CPUPerEvent the
	// same in µs per event, and PGCPUPerEvent the PostgreSQL backends'
	// (median of the measurements that have it).
	CPUPer10k     float64 `json:"cpu_seconds_per_10k,omitempty"`
	CPUPerEvent   float64 `json:"cpu_us_per_event,omitempty"`
	PGCPUPerEvent float64 `json:"pg_cpu_us_per_event,omitempty"`
	PeakRSS       int64   `json:"peak_rss_bytes,omitempty"`
	Idle          *Idle   `json:"idle,omitempty"`
	Pipelines     int     `json:"pipelines,omitempty"`
}

// summarise groups measurements into rows and checks the targets.
func (rep *Report) summarise() {
	type key struct {
		scenario, system, source, sink string
		events                         int
	}
	groups := map[key][]Measurement{}
	var order []key
	for _, m := range rep.Measurements {
		k := key{m.Scenario, m.System, m.Source, m.Sink, 0}
		if m.Scenario == ScenarioMemory {
			k.events = m.Events
		}
		if m.Scenario == ScenarioIdle || m.Scenario == ScenarioSteady {
			k.events = m.Pipelines
		}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], m)
	}
	baseline := func(system string, m Measurement) (Measurement, bool) {
		for _, b := range rep.Measurements {
			if b.Scenario == m.Scenario && b.System == system && b.Sink == m.Sink && b.Repeat == m.Repeat &&
				(system != SystemWatermill || b.Baseline == BaselineRouter) {
				return b, true
			}
		}
		return Measurement{}, false
	}
	rep.Rows = nil
	for _, k := range order {
		ms := groups[k]
		row := Row{Scenario: k.scenario, System: k.system, Source: k.source, Sink: k.sink, Runs: len(ms), Events: ms[0].Events,
			Pipelines: ms[0].Pipelines}
		var eps, vsw, ofc, off, cpux, cpu, pgcpu []float64
		for _, m := range ms {
			if m.EventsPerSec > 0 {
				eps = append(eps, m.EventsPerSec)
			}
			if m.Events > 0 {
				cpu = append(cpu, m.CPUSeconds/float64(m.Events)*1e4)
				if m.PGBackends > 0 {
					pgcpu = append(pgcpu, m.PGCPUSeconds/float64(m.Events)*1e6)
				}
			}
			row.PeakRSS = max(row.PeakRSS, m.PeakRSS)
			if k.system != SystemFerry || k.scenario == ScenarioIdle {
				continue
			}
			if k.scenario == ScenarioDrain {
				if b, ok := baseline(SystemWatermill, m); ok && b.EventsPerSec > 0 {
					vsw = append(vsw, m.EventsPerSec/b.EventsPerSec)
				}
				if c, ok := baseline(SystemCeiling, m); ok && c.EventsPerSec > 0 {
					ofc = append(ofc, 100*m.EventsPerSec/c.EventsPerSec)
					if m.Events > 0 && c.Events > 0 && c.CPUSeconds > 0 {
						cpux = append(cpux, (m.CPUSeconds/float64(m.Events))/(c.CPUSeconds/float64(c.Events)))
					}
				}
				if c, ok := baseline(SystemFranzCeiling, m); ok && c.EventsPerSec > 0 {
					off = append(off, 100*m.EventsPerSec/c.EventsPerSec)
				}
			}
		}
		row.EventsPerSec, row.EventsPerSecMin, row.EventsPerSecMax = medianRange(eps)
		row.VsWatermill, row.VsWatermillMin, row.VsWatermillMax = medianRange(vsw)
		row.OfCeiling, row.OfCeilingMin, row.OfCeilingMax = medianRange(ofc)
		row.OfFranzCeiling, row.OfFranzCeilingMin, row.OfFranzCeilingMax = medianRange(off)
		row.CPUVsCeiling, row.CPUVsCeilingMin, row.CPUVsCeilingMax = medianRange(cpux)
		row.CPUPer10k, _, _ = medianRange(cpu)
		row.CPUPerEvent = row.CPUPer10k * 100
		row.PGCPUPerEvent, _, _ = medianRange(pgcpu)
		if k.scenario == ScenarioIdle {
			row.CPUPer10k, row.CPUPerEvent, row.PGCPUPerEvent = 0, 0, 0
			row.Idle = ms[0].Idle
		}
		withLat := slices.DeleteFunc(slices.Clone(ms), func(m Measurement) bool { return m.Latency == nil })
		if len(withLat) > 0 {
			slices.SortFunc(withLat, func(a, b Measurement) int { return cmp.Compare(a.Latency.P99, b.Latency.P99) })
			row.Latency = withLat[(len(withLat)-1)/2].Latency
			row.P99Max = withLat[len(withLat)-1].Latency.P99
		}
		rep.Rows = append(rep.Rows, row)
	}
	rep.Targets = rep.checkTargets()
}

func medianRange(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// Target is one goal and whether this run met it.
type Target struct {
	Name   string  `json:"name"`
	Goal   string  `json:"goal"`
	Value  float64 `json:"value"`
	Got    string  `json:"got"`
	Met    bool    `json:"met"`
	Detail string  `json:"detail,omitempty"`
}

// Target thresholds (see docs/performance.md).
const (
	// Every source into every sink, drain.
	targetVsWatermill = 10.0
	// xid8 and wal into NATS: share of the ceiling's events/s, and CPU per
	// event at most this many times the ceiling client's.
	targetOfCeiling    = 60.0
	targetCPUVsCeiling = 2.0
	// xid8 and wal into Kafka: share of the franz-go ceiling (what kfake
	// takes from the leanest client) and of the Sarama one (the sink's
	// own library).
	targetOfFranzCeiling  = 30.0
	targetOfSaramaCeiling = 70.0
	// Every source into RabbitMQ: share of its ceiling; steady p99 at most
	// this many times the ceiling's.
	targetOfAMQPCeiling = 90.0
	targetP99AMQPTimes  = 2.0
	// poll's PostgreSQL µs per event: half the 26 µs of the round's start.
	targetPollPGCPU = 13.0
	// Steady p99 over the ceiling's own publish p99, in ms: xid8 and wal
	// into NATS; otherwise wal and the polling sources.
	targetP99NATS    = 2.0
	targetP99WAL     = 10.0
	targetP99Polling = 40.0
	targetRSS        = 150 << 20
	targetRSSFlat    = 1.20
	targetIdleCPU    = 5.0
)

func (rep *Report) row(scenario, system, source, sink string) (Row, bool) {
	for _, r := range rep.Rows {
		if r.Scenario == scenario && r.System == system && r.Source == source && r.Sink == sink {
			return r, true
		}
	}
	return Row{}, false
}

// share is a "≥ goal % of a ceiling" target.
func share(name string, goal, got, lo, hi float64, runs int) Target {
	return Target{Name: name, Goal: fmt.Sprintf("≥ %.0f%%", goal), Value: got,
		Got: fmt.Sprintf("%.0f%%%s", got, rangeText(runs, lo, hi, "%.0f")), Met: got >= goal}
}

func (rep *Report) checkTargets() []Target {
	var ts []Target
	for _, r := range rep.Rows {
		if r.System != SystemFerry {
			continue
		}
		cursor := r.Source == wal.Name || r.Source == xid8.Name
		switch r.Scenario {
		case ScenarioDrain:
			ts = append(ts, rep.drainTargets(r, cursor)...)
		case ScenarioSteady:
			c, ok := rep.row(ScenarioSteady, SystemCeiling, "", r.Sink)
			if !ok || c.Latency == nil || r.Latency == nil {
				continue
			}
			if r.Sink == rabbitmq.Name {
				limit := c.Latency.P99 * targetP99AMQPTimes
				ts = append(ts, Target{Name: fmt.Sprintf("steady %s p99 ≤ %.0f× ceiling p99", arrow(r.Source, r.Sink), targetP99AMQPTimes),
					Goal: fmt.Sprintf("≤ %.1f ms", limit), Value: r.Latency.P99,
					Got: fmt.Sprintf("%.1f ms (ceiling %.1f ms)", r.Latency.P99, c.Latency.P99), Met: r.Latency.P99 <= limit})
				continue
			}
			budget := targetP99Polling
			switch {
			case r.Sink == nats.Name && cursor:
				budget = targetP99NATS
			case r.Source == wal.Name:
				budget = targetP99WAL
			}
			limit := c.Latency.P99 + budget
			ts = append(ts, Target{Name: fmt.Sprintf("steady %s p99 ≤ ceiling p99 + %.0f ms at %d events/s", arrow(r.Source, r.Sink), budget, rep.Options.Rate),
				Goal: fmt.Sprintf("≤ %.1f ms", limit), Value: r.Latency.P99,
				Got: fmt.Sprintf("%.1f ms (ceiling %.1f ms)", r.Latency.P99, c.Latency.P99),
				Met: r.Latency.P99 <= limit})
		case ScenarioMemory:
			if r.Events != rep.Options.maxMemoryEvents() {
				continue
			}
			ts = append(ts, Target{Name: fmt.Sprintf("backlog-memory %s peak RSS ≤ 150 MB at %d rows", arrow(r.Source, r.Sink), r.Events),
				Goal: "≤ 150 MB", Value: float64(r.PeakRSS) / (1 << 20), Got: mb(r.PeakRSS), Met: r.PeakRSS <= targetRSS})
			if small, ok := rep.memoryRow(r, rep.Options.minMemoryEvents()); ok && small.PeakRSS > 0 && small.Events < r.Events {
				ratio := float64(r.PeakRSS) / float64(small.PeakRSS)
				ts = append(ts, Target{Name: fmt.Sprintf("backlog-memory %s flat: RSS at %d ≤ 1.2 × RSS at %d", arrow(r.Source, r.Sink), r.Events, small.Events),
					Goal: "≤ 1.20×", Value: ratio, Got: fmt.Sprintf("%.2f× (%s vs %s)", ratio, mb(r.PeakRSS), mb(small.PeakRSS)),
					Met: ratio <= targetRSSFlat})
			}
		case ScenarioIdle:
			if r.Idle == nil {
				continue
			}
			ts = append(ts, Target{Name: fmt.Sprintf("idle %s: %d pipelines ≤ 5%% of one core", arrow(r.Source, r.Sink), r.Pipelines),
				Goal: "≤ 5%", Value: r.Idle.CPUPercent, Got: fmt.Sprintf("%.2f%% (%.1f xact/s)", r.Idle.CPUPercent, r.Idle.XactPerSec),
				Met: r.Idle.CPUPercent <= targetIdleCPU})
		}
	}
	return ts
}

// drainTargets are r's drain goals: against Watermill for every source,
// against the ceilings per sink, and poll's database cost.
func (rep *Report) drainTargets(r Row, cursor bool) []Target {
	var ts []Target
	name := func(f string, a ...any) string {
		return "drain " + arrow(r.Source, r.Sink) + " " + fmt.Sprintf(f, a...)
	}
	if r.VsWatermill > 0 {
		ts = append(ts, Target{Name: name("≥ %.0f× watermill-sql", targetVsWatermill),
			Goal: fmt.Sprintf("≥ %.0f×", targetVsWatermill), Value: r.VsWatermill,
			Got: fmt.Sprintf("%.1f×%s", r.VsWatermill, rangeText(r.Runs, r.VsWatermillMin, r.VsWatermillMax, "%.1f")),
			Met: r.VsWatermill >= targetVsWatermill})
	}
	switch {
	case r.Sink == nats.Name && cursor && r.OfCeiling > 0:
		ts = append(ts, share(name("≥ %.0f%% of the NATS ceiling", targetOfCeiling), targetOfCeiling, r.OfCeiling, r.OfCeilingMin, r.OfCeilingMax, r.Runs))
		if r.CPUVsCeiling > 0 {
			ts = append(ts, Target{Name: name("CPU per event ≤ %.0f× the ceiling client's", targetCPUVsCeiling),
				Goal: fmt.Sprintf("≤ %.1f×", targetCPUVsCeiling), Value: r.CPUVsCeiling,
				Got: fmt.Sprintf("%.2f×%s", r.CPUVsCeiling, rangeText(r.Runs, r.CPUVsCeilingMin, r.CPUVsCeilingMax, "%.2f")),
				Met: r.CPUVsCeiling <= targetCPUVsCeiling})
		}
	case r.Sink == kafka.Name && cursor:
		if r.OfFranzCeiling > 0 {
			ts = append(ts, share(name("≥ %.0f%% of the franz-go ceiling (kfake)", targetOfFranzCeiling), targetOfFranzCeiling,
				r.OfFranzCeiling, r.OfFranzCeilingMin, r.OfFranzCeilingMax, r.Runs))
		}
		if r.OfCeiling > 0 {
			ts = append(ts, share(name("≥ %.0f%% of the Sarama ceiling (the sink's library)", targetOfSaramaCeiling), targetOfSaramaCeiling,
				r.OfCeiling, r.OfCeilingMin, r.OfCeilingMax, r.Runs))
		}
	case r.Sink == rabbitmq.Name && r.OfCeiling > 0:
		ts = append(ts, share(name("≥ %.0f%% of the RabbitMQ ceiling", targetOfAMQPCeiling), targetOfAMQPCeiling, r.OfCeiling, r.OfCeilingMin, r.OfCeilingMax, r.Runs))
	}
	if r.Source == poll.Name && r.PGCPUPerEvent > 0 {
		ts = append(ts, Target{Name: name("PostgreSQL ≤ %.0f µs per event", targetPollPGCPU),
			Goal: fmt.Sprintf("≤ %.0f µs", targetPollPGCPU), Value: r.PGCPUPerEvent, Got: fmt.Sprintf("%.1f µs", r.PGCPUPerEvent),
			Met: r.PGCPUPerEvent <= targetPollPGCPU})
	}
	return ts
}

func (rep *Report) memoryRow(r Row, events int) (Row, bool) {
	for _, x := range rep.Rows {
		if x.Scenario == ScenarioMemory && x.System == SystemFerry && x.Source == r.Source && x.Sink == r.Sink && x.Events == events {
			return x, true
		}
	}
	return Row{}, false
}

func (o ReportOptions) maxMemoryEvents() int { return slices.Max(append([]int{0}, o.MemoryEvents...)) }
func (o ReportOptions) minMemoryEvents() int {
	if len(o.MemoryEvents) == 0 {
		return 0
	}
	return slices.Min(o.MemoryEvents)
}

func rangeText(runs int, lo, hi float64, f string) string {
	if runs < 2 {
		return ""
	}
	return fmt.Sprintf(" ("+f+"–"+f+")", lo, hi)
}

// Met reports whether every target was met.
func (rep *Report) Met() bool {
	for _, t := range rep.Targets {
		if !t.Met {
			return false
		}
	}
	return true
}

// columns of the table, shared by the text and markdown renderings.
var columns = []string{"scenario", "source", "sink", "system", "events", "events/s", "× watermill-sql", "% of ceiling", "p50 / p99 ms", "CPU µs/event", "PostgreSQL µs/event", "peak RSS"}

func (rep *Report) cells(r Row) []string {
	dash := "—"
	c := []string{r.Scenario, cmp.Or(r.Source, dash), r.Sink, r.System, fmt.Sprint(r.Events), dash, dash, dash, dash, dash, dash, mb(r.PeakRSS)}
	if r.Scenario == ScenarioIdle {
		c[4] = fmt.Sprintf("%d pipelines", r.Pipelines)
		if r.Idle != nil {
			c[5] = fmt.Sprintf("idle: %.2f%% of a core, %.1f xact/s, %d server connections, %d broker connections, started in %.1fs",
				r.Idle.CPUPercent, r.Idle.XactPerSec, r.Idle.Connections, r.Idle.BrokerConnections, r.Idle.StartSeconds)
		}
		return c
	}
	if r.Pipelines > 1 {
		c[4] = fmt.Sprintf("%d (%d pipelines)", r.Events, r.Pipelines)
	}
	if r.EventsPerSec > 0 {
		c[5] = fmt.Sprintf("%.0f%s", r.EventsPerSec, rangeText(r.Runs, r.EventsPerSecMin, r.EventsPerSecMax, "%.0f"))
	}
	if r.VsWatermill > 0 {
		c[6] = fmt.Sprintf("%.1f×%s", r.VsWatermill, rangeText(r.Runs, r.VsWatermillMin, r.VsWatermillMax, "%.1f"))
	}
	if r.OfCeiling > 0 {
		c[7] = fmt.Sprintf("%.0f%%%s", r.OfCeiling, rangeText(r.Runs, r.OfCeilingMin, r.OfCeilingMax, "%.0f"))
	}
	if r.Latency != nil {
		c[8] = fmt.Sprintf("%.1f / %.1f", r.Latency.P50, r.Latency.P99)
		if r.Runs > 1 && r.P99Max > r.Latency.P99 {
			c[8] += fmt.Sprintf(" (worst p99 %.1f)", r.P99Max)
		}
	}
	if r.CPUPerEvent > 0 {
		c[9] = fmt.Sprintf("%.1f", r.CPUPerEvent)
	}
	if r.PGCPUPerEvent > 0 {
		c[10] = fmt.Sprintf("%.1f", r.PGCPUPerEvent)
	}
	if r.System == SystemCeiling || r.System == SystemFranzCeiling {
		c[11] = dash // prebuilt messages: its memory says nothing
	}
	return c
}

// WriteText writes the table and the targets for a terminal.
func (rep *Report) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(upper(columns), "\t"))
	for _, r := range rep.Rows {
		fmt.Fprintln(tw, strings.Join(rep.cells(r), "\t"))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, s := range rep.Services {
		fmt.Fprintln(w, "• "+s)
	}
	fmt.Fprintf(w, "• machine: %d CPUs (%s), GOMAXPROCS %d, %s; load average %s before, %s after\n",
		rep.Machine.CPUs, rep.Machine.CPU, rep.Machine.GOMAXPROCS, rep.Machine.Go, rep.LoadBefore, rep.LoadAfter)
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w, "\nTargets:")
		for _, t := range rep.Targets {
			fmt.Fprintf(w, "  %-4s %s: %s (goal %s)\n", metText(t.Met), t.Name, t.Got, t.Goal)
		}
	}
	for _, f := range rep.Failures {
		fmt.Fprintln(w, "FAILED: "+f)
	}
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func upper(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToUpper(v)
	}
	return out
}

// WriteMarkdown writes the table, the services and the targets as
// Markdown (docs/performance.md embeds it).
func (rep *Report) WriteMarkdown(w io.Writer) {
	fmt.Fprintln(w, "| "+strings.Join(columns, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat("---|", len(columns)))
	for _, r := range rep.Rows {
		fmt.Fprintln(w, "| "+strings.Join(rep.cells(r), " | ")+" |")
	}
	fmt.Fprintln(w)
	for _, s := range rep.Services {
		fmt.Fprintln(w, "- "+s)
	}
	fmt.Fprintf(w, "- machine: %d CPUs (%s), GOMAXPROCS %d, %s; load average %s before the run, %s after\n",
		rep.Machine.CPUs, rep.Machine.CPU, rep.Machine.GOMAXPROCS, rep.Machine.Go, rep.LoadBefore, rep.LoadAfter)
	fmt.Fprintf(w, "- run %s – %s (%s)\n", rep.Started.Format(time.RFC3339), rep.Finished.Format("15:04:05Z"), rep.Finished.Sub(rep.Started).Round(time.Second))
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w, "\n| target | goal | this run | |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, t := range rep.Targets {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.Name, t.Goal, t.Got, metText(t.Met))
		}
	}
	for _, f := range rep.Failures {
		fmt.Fprintln(w, "\nFAILED: "+f)
	}
}
