// Package pipelines is Ferry's pipeline model: the YAML schema and its
// loader (strict decoding, ${VAR} interpolation, errors that name file, line
// and path, and in control-plane mode the rules a tenant's pipeline obeys),
// and what a loaded Spec says of itself (its masks, its tenant's limits).
// Package engine runs what it loads.
//
// It knows components only through the plugins API — factories from a
// plugins.Registry and the capabilities listed in plugins — and must not
// import the engine, any component (sources/, transforms/, sinks/: binaries
// register them), the CLI, the HTTP API or the console, nor lab code
// (bench, chaos, test harnesses).
package pipelines

import (
	"fmt"
	"regexp"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/tracing"
)

// Spec is one pipeline as loaded: decoded over defaults and validated.
type Spec struct {
	// Name is unique across all loaded files.
	Name string
	// broken marks a document that failed to load, kept by the loader only
	// to check its name against the others.
	broken bool
	// Tenant is the team owning the pipeline; optional.
	Tenant string
	// File and Line locate the pipeline's document.
	File string
	Line int

	Source     Component
	Transforms []Component
	Sink       Component
	Limits     Limits
	// DeadLetter, when set, receives events that cannot be delivered.
	DeadLetter *DeadLetter
	// Canary, when set, tells the pipeline quiet from stalled (`canary:`,
	// or a transform of type canary in the older form); the engine runs it.
	Canary *Canary
	// Hash identifies the pipeline's configuration after interpolation; a
	// reload restarts only pipelines whose hash changed.
	Hash string
	// TenantLimits are the limits of the pipeline's tenant, when a `kind:
	// tenant` document sets them.
	TenantLimits *Limits
	// Ownership is exclusive (one instance at a time; the default) or shared
	// (every instance runs it; poll only).
	Ownership string
	// Tracing turns on a span per event publish (`tracing:`).
	Tracing tracing.Config
	// Paused is the pipeline's desired state when it is kept elsewhere (a
	// store pipeline paused over the API): the engine keeps it known, as a
	// paused pipeline whose backlog is still measured, and runs nothing.
	// Not part of the YAML.
	Paused bool
	// Masks are the values ${…} references filled in (from the environment
	// or the tenant's secrets, not defaults written in the document) of at
	// least MinMaskLen characters, deduplicated, longest first: what Mask
	// hides in the pipeline's errors and logs.
	Masks []string
	// maskRefs names, for each of Masks the loader found, the reference
	// that filled it in ("${DB_URL}").
	maskRefs map[string]string
}

// Ownership modes.
const (
	OwnershipExclusive = "exclusive"
	OwnershipShared    = "shared"
)

// DeadLetter is the pipeline's dead-letter topic, on the pipeline's sink.
// Events that no retry can fix — no route, a payload the broker refuses,
// a transform error that outlasts the retry policy — go there with headers
// saying why, and the pipeline moves on.
type DeadLetter struct {
	// Topic is the dead-letter topic (Kafka topic, RabbitMQ routing key,
	// NATS subject). Required.
	Topic string `yaml:"topic"`
}

// Validate reports a missing topic.
func (d *DeadLetter) Validate() error {
	var p plugins.Problems
	if d.Topic == "" {
		p.Add("topic", "must not be empty")
	}
	return p.Err()
}

// Component is one configured stage.
type Component struct {
	// Type is the registered name, e.g. "xid8".
	Type string
	// Path is where it sits in the YAML: "source", "transforms[1]", "sink".
	Path    string
	Factory plugins.Factory
	Config  plugins.Config
}

// Limits bound what one pipeline may hold or use.
type Limits struct {
	// MaxInFlight is the most events read but not yet confirmed by the broker.
	// Default 1000. For a tenant: the most events of all its pipelines being
	// transformed and published at once.
	MaxInFlight int `yaml:"max_in_flight"`
	// Rate caps events per second (Watermill's throttle); 0 is no cap. For a
	// tenant: shared by all its pipelines.
	Rate int `yaml:"rate"`
	// MaxConnections caps the source's connections to its database; 0 lets
	// the source decide. For a tenant: split evenly among its pipelines.
	MaxConnections int `yaml:"max_connections"`
}

// DefaultLimits are the limits of a pipeline that sets none.
func DefaultLimits() Limits { return Limits{MaxInFlight: 1000} }

// Validate reports every bad limit.
func (l Limits) Validate() error {
	var p plugins.Problems
	if l.MaxInFlight < 1 {
		p.Add("max_in_flight", "must be at least 1, got %d", l.MaxInFlight)
	}
	if l.Rate < 0 {
		p.Add("rate", "must not be negative (0 is no cap)")
	}
	if l.MaxConnections < 0 {
		p.Add("max_connections", "must not be negative (0 lets the source decide)")
	}
	return p.Err()
}

// TenantSpec is a `kind: tenant` document: limits shared by every pipeline
// of one tenant.
type TenantSpec struct {
	Name   string
	File   string
	Line   int
	Limits Limits
}

// Describe is a one-line summary without secrets: "orders (xid8 → nats)",
// "orders (xid8 → event_router → nats, canary)".
func (s *Spec) Describe() string {
	stages := s.Source.Type
	for _, t := range s.Transforms {
		stages += " → " + t.Type
	}
	canary := ""
	if s.Canary != nil {
		canary = ", canary"
	}
	return fmt.Sprintf("%s (%s → %s%s)", s.Name, stages, s.Sink.Type, canary)
}

// pipelineName is what a pipeline or tenant may be called: it becomes part of
// replication slot, publication and metric names.
var pipelineName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,47}$`)
