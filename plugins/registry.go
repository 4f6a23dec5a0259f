package plugins

import (
	"fmt"
	"regexp"
	"slices"
	"sync"
)

// Kind is the role a component plays in a pipeline.
type Kind string

// The three kinds of component.
const (
	KindSource    Kind = "source"
	KindTransform Kind = "transform"
	KindSink      Kind = "sink"
)

// Factory makes one kind of component. NewConfig returns a config filled with
// defaults; the loader decodes the user's YAML over it and calls Validate
// before New is ever called.
type Factory struct {
	Kind Kind
	// Name is what users write as `type:` in YAML.
	Name string
	// NewConfig returns a fresh config holding the defaults.
	NewConfig func() Config
	// build makes the component; it must not do I/O.
	build func(cfg Config, env Env) (any, error)
}

// Build makes the component from a config returned by NewConfig.
func (f Factory) Build(cfg Config, env Env) (any, error) { return f.build(cfg, env) }

// Registry maps component names to factories. It is safe for concurrent use.
// Default is the registry `ferry` binaries use; tests and embedders can make
// their own with NewRegistry.
type Registry struct {
	mu        sync.RWMutex
	factories map[Kind]map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[Kind]map[string]Factory{}}
}

// Default is the process-wide registry. Component packages add themselves to it
// from init, so a blank import is enough to make a component available.
var Default = NewRegistry()

var validName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// Register adds f. An empty, malformed or duplicate name panics: it is a
// programmer error that must surface at start-up, not when a pipeline loads.
func (r *Registry) Register(f Factory) {
	if !validName.MatchString(f.Name) {
		panic(fmt.Sprintf("plugins: %s name %q must be lowercase letters, digits and _", f.Kind, f.Name))
	}
	if f.NewConfig == nil || f.build == nil {
		panic(fmt.Sprintf("plugins: %s %q has no config or constructor", f.Kind, f.Name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	byName := r.factories[f.Kind]
	if byName == nil {
		byName = map[string]Factory{}
		r.factories[f.Kind] = byName
	}
	if _, dup := byName[f.Name]; dup {
		panic(fmt.Sprintf("plugins: %s %q registered twice", f.Kind, f.Name))
	}
	byName[f.Name] = f
}

// Lookup returns the factory registered for kind and name.
func (r *Registry) Lookup(kind Kind, name string) (Factory, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	f, ok := r.factories[kind][name]
	return f, ok
}

// Names lists the registered names of kind, sorted.
func (r *Registry) Names(kind Kind) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.factories[kind]))
	for n := range r.factories[kind] {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// RegisterSource adds a source factory to r. C is the component's config
// type, normally a pointer to its Config struct.
func RegisterSource[C Config](r *Registry, name string, defaults func() C, build func(C, Env) (Source, error)) {
	r.Register(Factory{Kind: KindSource, Name: name, NewConfig: func() Config { return defaults() },
		build: func(c Config, env Env) (any, error) { return build(c.(C), env) }})
}

// RegisterTransform adds a transform factory to r.
func RegisterTransform[C Config](r *Registry, name string, defaults func() C, build func(C, Env) (Transform, error)) {
	r.Register(Factory{Kind: KindTransform, Name: name, NewConfig: func() Config { return defaults() },
		build: func(c Config, env Env) (any, error) { return build(c.(C), env) }})
}

// RegisterSink adds a sink factory to r.
func RegisterSink[C Config](r *Registry, name string, defaults func() C, build func(C, Env) (Sink, error)) {
	r.Register(Factory{Kind: KindSink, Name: name, NewConfig: func() Config { return defaults() },
		build: func(c Config, env Env) (any, error) { return build(c.(C), env) }})
}
