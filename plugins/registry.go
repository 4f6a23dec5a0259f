package plugins

import (
	"fmt"
	"maps"
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
// before the component is ever built. Factories are made by RegisterSource,
// RegisterTransform and RegisterSink, which fix the kind and the config type
// the constructor accepts.
//
// Building is typed: BuildSource, BuildTransform and BuildSink return the
// component as its interface. Asking a factory for another kind than its
// own, or passing a config that is not the factory's (one of another
// component), is an error, never a panic.
type Factory struct {
	Kind Kind
	// Name is what users write as `type:` in YAML.
	Name string
	// NewConfig returns a fresh config holding the defaults.
	NewConfig func() Config

	// Exactly one constructor is set, the one of Kind; none does I/O.
	source    func(cfg Config, env Env) (Source, error)
	transform func(cfg Config, env Env) (Transform, error)
	sink      func(cfg Config, env Env) (Sink, error)
}

// BuildSource makes the source from a config returned by NewConfig.
func (f Factory) BuildSource(cfg Config, env Env) (Source, error) {
	if f.source == nil {
		return nil, f.wrongKind(KindSource)
	}
	return f.source(cfg, env)
}

// BuildTransform makes the transform from a config returned by NewConfig.
func (f Factory) BuildTransform(cfg Config, env Env) (Transform, error) {
	if f.transform == nil {
		return nil, f.wrongKind(KindTransform)
	}
	return f.transform(cfg, env)
}

// BuildSink makes the sink from a config returned by NewConfig.
func (f Factory) BuildSink(cfg Config, env Env) (Sink, error) {
	if f.sink == nil {
		return nil, f.wrongKind(KindSink)
	}
	return f.sink(cfg, env)
}

func (f Factory) wrongKind(want Kind) error {
	return fmt.Errorf("plugins: %s %q cannot build a %s", f.Kind, f.Name, want)
}

// wellFormed reports whether f has a config and exactly the constructor of
// its kind.
func (f Factory) wellFormed() bool {
	if f.NewConfig == nil || f.constructors() != 1 {
		return false
	}
	switch f.Kind {
	case KindSource:
		return f.source != nil
	case KindTransform:
		return f.transform != nil
	case KindSink:
		return f.sink != nil
	}
	return false
}

// constructors counts the constructors f has.
func (f Factory) constructors() int {
	n := 0
	for _, set := range []bool{f.source != nil, f.transform != nil, f.sink != nil} {
		if set {
			n++
		}
	}
	return n
}

// typed adapts a constructor of config type C to any Config: a config of
// another type (another component's) is an error naming both types.
func typed[C Config, T any](kind Kind, name string, build func(C, Env) (T, error)) func(Config, Env) (T, error) {
	return func(cfg Config, env Env) (T, error) {
		c, ok := cfg.(C)
		if !ok {
			var zero T
			return zero, fmt.Errorf("plugins: %s %q wants a %T config, got %T", kind, name, *new(C), cfg)
		}
		return build(c, env)
	}
}

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
	if !f.wellFormed() {
		panic(fmt.Sprintf("plugins: %s %q needs a config and one constructor (use RegisterSource, RegisterTransform or RegisterSink)", f.Kind, f.Name))
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

// Clone returns a registry holding r's factories: what is registered in
// the clone afterwards stays out of r (a test's own components stay out of
// Default).
func (r *Registry) Clone() *Registry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := NewRegistry()
	for kind, byName := range r.factories {
		c.factories[kind] = maps.Clone(byName)
	}
	return c
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
		source: typed(KindSource, name, build)})
}

// RegisterTransform adds a transform factory to r.
func RegisterTransform[C Config](r *Registry, name string, defaults func() C, build func(C, Env) (Transform, error)) {
	r.Register(Factory{Kind: KindTransform, Name: name, NewConfig: func() Config { return defaults() },
		transform: typed(KindTransform, name, build)})
}

// RegisterSink adds a sink factory to r.
func RegisterSink[C Config](r *Registry, name string, defaults func() C, build func(C, Env) (Sink, error)) {
	r.Register(Factory{Kind: KindSink, Name: name, NewConfig: func() Config { return defaults() },
		sink: typed(KindSink, name, build)})
}
