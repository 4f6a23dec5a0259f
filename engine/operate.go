package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ferryhq/ferry/pipelines"
)

// ErrConflict is returned for an operation the pipeline's state does not
// allow (pausing a paused pipeline, resuming a running one).
var ErrConflict = errors.New("conflict")

// Pause stops reading, lets in-flight events finish and records progress;
// the pipeline stays paused until Resume.
func (s *Supervisor) Pause(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	e, err := s.ownedEntry(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if e.status.State == StatePaused {
		s.mu.Unlock()
		return fmt.Errorf("%w: %s is already paused", ErrConflict, name)
	}
	e.setState(StatePaused) // set first: the stopping incarnation keeps it
	s.mu.Unlock()
	s.halt(e)
	s.probeHealth(e) // rows keep arriving while paused: show them
	return nil
}

// Resume starts a paused pipeline again from its recorded progress.
func (s *Supervisor) Resume(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	e, err := s.entry(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	paused := e.status.State == StatePaused
	s.mu.Unlock()
	if !paused {
		return fmt.Errorf("%w: %s is not paused", ErrConflict, name)
	}
	return s.start(e)
}

// ReloadResult says what a reload did, by pipeline name.
type ReloadResult struct {
	Started   []string `json:"started"`
	Restarted []string `json:"restarted"`
	Stopped   []string `json:"stopped"`
	Unchanged []string `json:"unchanged"`
}

// Reload makes the running set match specs: pipelines no longer there are
// stopped, those whose configuration changed are drained and restarted,
// new ones start, and unchanged ones are left alone (no restart, no lost
// position). Validation happens before: Reload only gets a valid set.
func (s *Supervisor) Reload(specs []*pipelines.Spec) (ReloadResult, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	var r ReloadResult
	want := map[string]*pipelines.Spec{}
	for _, sp := range specs {
		want[sp.Name] = sp
	}
	s.mu.Lock()
	current := map[string]*entry{}
	for name, e := range s.pipelines {
		current[name] = e
	}
	s.mu.Unlock()

	var errs []error
	for name := range current {
		if _, keep := want[name]; !keep {
			errs = append(errs, s.stop(name))
			r.Stopped = append(r.Stopped, name)
		}
	}
	for name, sp := range want {
		e, exists := current[name]
		switch {
		case !exists:
			errs = append(errs, s.add(sp))
			r.Started = append(r.Started, name)
		case e.spec.Hash != sp.Hash:
			s.halt(e)
			s.mu.Lock()
			e.spec = sp
			e.rep.spec.Store(sp) // errors before the restart are masked with the new secrets
			e.status.Tenant, e.status.Source, e.status.Sink = sp.Tenant, sp.Source.Type, sp.Sink.Type
			// Pipelines another instance owns (or nobody yet) start when this
			// one owns them; paused ones stay paused with their new
			// configuration until resumed.
			waiting := (s.exclusive(e) && e.lock == nil) || e.status.State == StatePaused
			s.mu.Unlock()
			if !waiting {
				errs = append(errs, s.start(e))
			}
			r.Restarted = append(r.Restarted, name)
		default:
			r.Unchanged = append(r.Unchanged, name)
		}
	}
	for _, l := range [][]string{r.Started, r.Restarted, r.Stopped, r.Unchanged} {
		slices.Sort(l)
	}
	return r, errors.Join(errs...)
}
