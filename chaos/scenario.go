package chaos

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Fault is one thing the suite breaks.
type Fault string

// The faults.
const (
	// Kill: SIGKILL the Ferry process, start a new one.
	Kill Fault = "kill"
	// BrokerRestart: stop the broker for the outage, start it again.
	BrokerRestart Fault = "broker-restart"
	// PGCrash: stop PostgreSQL with `-m immediate`, start it again (crash
	// recovery).
	PGCrash Fault = "pg-crash"
	// BrokerCut, PGCut: reset Ferry's connections to the broker (or the
	// database) and refuse new ones for the outage.
	BrokerCut Fault = "broker-cut"
	PGCut     Fault = "pg-cut"
	// BrokerStall, PGStall: freeze Ferry's connections to the broker (or
	// the database) for the outage; then the held bytes flow on.
	BrokerStall Fault = "broker-stall"
	PGStall     Fault = "pg-stall"
	// BrokerBlackhole, PGBlackhole: freeze Ferry's connections to the
	// broker (or the database) for good; connections opened after the
	// outage work. Ferry has to notice the dead ones itself.
	BrokerBlackhole Fault = "broker-blackhole"
	PGBlackhole     Fault = "pg-blackhole"
)

// Sources and Sinks are every source and sink the suite runs.
var (
	Sources = []string{"xid8", "poll", "wal"}
	Sinks   = []string{"nats", "kafka", "rabbitmq"}
)

// OrderPromised reports whether a source promises per-aggregate commit
// order (README, Guarantees): xid8 and wal do; poll only within one
// worker's claims, so its violations are reported, not failed.
func OrderPromised(source string) bool { return source != "poll" }

// Scenario is a named sequence of faults injected while a writer commits
// randomized interleavings.
type Scenario struct {
	Name   string
	Faults []Fault
	// Rounds, when set, is how many interleavings the writer commits (and
	// the scenario ends when they are delivered); else the writer runs
	// until the faults are done.
	Rounds int
	// Overlap is the chance that a fault follows the previous one before
	// the pipeline recovered from it (mixed scenarios).
	Overlap float64
	// Outage, when set, replaces Config.Outage.
	Outage time.Duration
}

// Counts sizes a run of the suite.
type Counts struct {
	Kills, BrokerRestarts, PGCrashes int
	// NetCuts is how many network faults each of the broker and database
	// links gets, alternating cut and stall.
	NetCuts int
	// HalfOpen is how many half-open connections, alternately to the
	// database and to the broker.
	HalfOpen int
	// LongOutages is how many times the broker is unreachable for
	// LongOutage (a network cut, so the machine's shared RabbitMQ keeps
	// running for everyone else).
	LongOutages   int
	Interleavings int
	// Mixed is how many faults, of every kind, the mixed scenario injects.
	Mixed int
}

// Scenarios lists the scenarios for counts: each fault alone, the
// interleavings without faults, and all of them mixed.
func Scenarios(c Counts, seed uint64) []Scenario {
	rep := func(f Fault, n int) []Fault { return slices.Repeat([]Fault{f}, n) }
	alternate := func(a, b Fault, n int) []Fault {
		out := make([]Fault, n)
		for i := range out {
			out[i] = a
			if i%2 == 1 {
				out[i] = b
			}
		}
		return out
	}
	var ss []Scenario
	add := func(s Scenario) {
		if len(s.Faults) > 0 || s.Rounds > 0 {
			ss = append(ss, s)
		}
	}
	add(Scenario{Name: "kill", Faults: rep(Kill, c.Kills)})
	add(Scenario{Name: "broker-restart", Faults: rep(BrokerRestart, c.BrokerRestarts)})
	add(Scenario{Name: "pg-crash", Faults: rep(PGCrash, c.PGCrashes)})
	add(Scenario{Name: "net-broker", Faults: alternate(BrokerCut, BrokerStall, c.NetCuts)})
	add(Scenario{Name: "net-pg", Faults: alternate(PGCut, PGStall, c.NetCuts)})
	add(Scenario{Name: "half-open", Faults: alternate(PGBlackhole, BrokerBlackhole, c.HalfOpen)})
	add(Scenario{Name: "long-outage", Faults: rep(BrokerCut, c.LongOutages), Outage: LongOutage})
	add(Scenario{Name: "interleavings", Rounds: c.Interleavings})
	if c.Mixed > 0 {
		all := []Fault{Kill, BrokerRestart, PGCrash, BrokerCut, BrokerStall, PGCut, PGStall}
		rng := rand.New(rand.NewPCG(seed, 0x0d15))
		m := Scenario{Name: "mixed", Overlap: 0.3}
		for i := range c.Mixed {
			// Every kind at least once, then at random.
			f := all[i%len(all)]
			if i >= len(all) {
				f = all[rng.IntN(len(all))]
			}
			m.Faults = append(m.Faults, f)
		}
		rng.Shuffle(len(m.Faults), func(i, j int) { m.Faults[i], m.Faults[j] = m.Faults[j], m.Faults[i] })
		add(m)
	}
	return ss
}

// LongOutage is how long the long-outage scenario keeps the broker away:
// longer than a minute, as a broker's rolling restart or a failover takes.
const LongOutage = 75 * time.Second

// Config is how one scenario runs.
type Config struct {
	Source, Sink string
	// MaxInFlight is the pipeline's limits.max_in_flight: the duplicate
	// bound per fault.
	MaxInFlight int
	// Outage is how long a broker or the database stays down and a network
	// fault lasts.
	Outage time.Duration
	// Settle is how many new events must arrive before the next fault, so
	// each one hits a pipeline that runs mid-stream.
	Settle int
	// Writer shapes the traffic.
	Writer WriterConfig
	// RecoveryTimeout bounds each recovery; DrainTimeout the final delivery
	// of everything committed.
	RecoveryTimeout, DrainTimeout time.Duration
	// Seed drives fault timing and the writer.
	Seed uint64
	// ChildArgs are the `ferry run` flags after `-c FILE`; default ChildArgs.
	ChildArgs []string
	// SourceYAML is added to the pipeline's source section (keys indented
	// two spaces), e.g. "  max_attempts: 3\n".
	SourceYAML string
}

// DefaultConfig is the configuration the suite runs source × sink with.
func DefaultConfig(source, sink string) Config {
	return Config{Source: source, Sink: sink, MaxInFlight: 100, Outage: 2 * time.Second, Settle: 50,
		Writer: DefaultWriterConfig(), RecoveryTimeout: 2 * time.Minute, DrainTimeout: 3 * time.Minute, Seed: 1, ChildArgs: ChildArgs}
}

// Result is one scenario's outcome: the row of the reliability table.
type Result struct {
	Scenario, Source, Sink string
	Faults                 int
	Rounds                 int // interleavings the writer committed
	Events                 int // committed events
	Deliveries             int // messages on the broker
	Lost                   int
	Phantom                int // delivered, never committed
	RolledBackDelivered    int
	OrderViolations        int
	OrderPromised          bool
	Duplicates             int
	DuplicateBound         int
	// Recovery is, per fault the pipeline was given time to recover from,
	// the time from the fault's end to the first new event on the broker.
	Recovery []time.Duration
	Duration time.Duration
	// Failures say why the scenario failed; empty when it passed.
	Failures []string
	// Notes explain the numbers (e.g. where a duplicate bound comes from).
	Notes []string
	// Log is the Ferry process's output (tail, for failures).
	Log string
}

// Passed reports whether every verdict held.
func (r Result) Passed() bool { return len(r.Failures) == 0 }
