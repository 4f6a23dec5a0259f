package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Combo is one source × sink pairing.
type Combo struct{ Source, Sink string }

func (c Combo) String() string { return c.Source + "-" + c.Sink }

// Plan is a run of the suite: which pairings, how many faults of each kind.
type Plan struct {
	Name   string
	Combos []Combo
	Counts Counts
	// NoBrokerRestart lists sinks whose broker the plan must not restart:
	// in CI the machine's RabbitMQ is shared with the other packages'
	// tests, which run at the same time.
	NoBrokerRestart map[string]bool
	// Only, when set, is the plan's one scenario (SingleScenarioPlan).
	Only *Scenario
	// Outage, when set, replaces each scenario's default outage.
	Outage time.Duration
}

// FullPlan is `make chaos`: every source × sink, 20 kills, 5 broker
// restarts, 3 PostgreSQL crashes, 4 network faults on each link, 2
// half-open connections, a 75-second broker outage, 1,000 randomized commit
// interleavings and 10 mixed faults.
func FullPlan() Plan {
	p := Plan{Name: "full", Counts: Counts{Kills: 20, BrokerRestarts: 5, PGCrashes: 3, NetCuts: 4, HalfOpen: 2, LongOutages: 1,
		Interleavings: 1000, Mixed: 10}}
	for _, so := range Sources {
		for _, si := range Sinks {
			p.Combos = append(p.Combos, Combo{so, si})
		}
	}
	return p
}

// CIPlan is the bounded run inside `go test ./...`: one sink per source,
// every kind of fault a few times.
func CIPlan() Plan {
	return Plan{
		Name:            "ci",
		Combos:          []Combo{{"xid8", "nats"}, {"wal", "kafka"}, {"poll", "rabbitmq"}},
		Counts:          Counts{Kills: 2, BrokerRestarts: 1, PGCrashes: 1, NetCuts: 2, Interleavings: 50},
		NoBrokerRestart: map[string]bool{"rabbitmq": true},
	}
}

// ScenariosFor lists the scenarios of the plan for one pairing.
func (p Plan) ScenariosFor(c Combo, seed uint64) []Scenario {
	if p.Only != nil {
		return []Scenario{*p.Only}
	}
	counts := p.Counts
	noRestart := p.NoBrokerRestart[c.Sink]
	if noRestart {
		counts.BrokerRestarts = 0
	}
	ss := Scenarios(counts, seed)
	if noRestart {
		for i := range ss {
			kept := ss[i].Faults[:0]
			for _, f := range ss[i].Faults {
				if f != BrokerRestart {
					kept = append(kept, f)
				}
			}
			ss[i].Faults = kept
		}
	}
	return ss
}

// MatrixPlan is every source × sink with the CI plan's counts: a quick
// look at the whole matrix.
func MatrixPlan() Plan {
	p := CIPlan()
	p.Name = "matrix"
	p.Combos = FullPlan().Combos
	return p
}

// Config is how the plan runs one scenario of a pairing. A half-open
// connection that Ferry never notices would hold the pipeline until the
// kernel gives up (minutes): the scenario fails sooner.
func (p Plan) Config(c Combo, sc Scenario) Config {
	cfg := DefaultConfig(c.Source, c.Sink)
	if p.Outage > 0 {
		cfg.Outage = p.Outage
	}
	if sc.Name == "half-open" || sc.Name == "long-outage" {
		cfg.RecoveryTimeout, cfg.DrainTimeout = 90*time.Second, 90*time.Second
	}
	return cfg
}

// SingleScenarioPlan is one scenario on one pairing, given as
// "source,sink,fault,count[,outage]" (fault "mixed" for count mixed
// faults), to reproduce a failure.
func SingleScenarioPlan(spec string) (Plan, error) {
	p := strings.Split(spec, ",")
	if len(p) < 4 {
		return Plan{}, fmt.Errorf("scenario %q: want source,sink,fault,count[,outage]", spec)
	}
	n, err := strconv.Atoi(p[3])
	if err != nil {
		return Plan{}, fmt.Errorf("scenario %q: count: %w", spec, err)
	}
	plan := Plan{Name: "single", Combos: []Combo{{p[0], p[1]}}}
	if len(p) > 4 {
		if plan.Outage, err = time.ParseDuration(p[4]); err != nil {
			return Plan{}, fmt.Errorf("scenario %q: outage: %w", spec, err)
		}
	}
	sc := Scenario{Name: p[2], Faults: make([]Fault, n)}
	if p[2] == "mixed" {
		sc = Scenarios(Counts{Mixed: n}, uint64(time.Now().UnixNano()))[0]
	} else {
		for i := range sc.Faults {
			sc.Faults[i] = Fault(p[2])
		}
	}
	plan.Only = &sc
	return plan, nil
}
