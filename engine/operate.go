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
	paused := false
	s.entries.with(e, func(e *entry) { paused = e.status.State == StatePaused })
	if paused {
		return fmt.Errorf("%w: %s is already paused", ErrConflict, name)
	}
	s.haltForPause(e)
	s.entries.probe(e, s.log) // rows keep arriving while paused: show them
	return nil
}

// haltForPause stops e's incarnation and only then shows the pipeline
// paused: paused says that nothing reads or records its progress any more,
// which a change of that progress waits for (the API's offsets reset and
// backfill). Shown paused while the incarnation still drained, a reset
// made meanwhile was overwritten by the stopping reader's last commit,
// and the backfill progress read at the pause moved after it.
func (s *Supervisor) haltForPause(e *entry) {
	s.entries.with(e, func(e *entry) {
		if e.inc != nil {
			e.inc.pausing = true
		}
	})
	s.life.halt(e)
	s.entries.with(e, func(e *entry) { e.setState(StatePaused) })
}

// Resume starts a paused pipeline again from its recorded progress.
func (s *Supervisor) Resume(name string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	e, err := s.entries.get(name)
	if err != nil {
		return err
	}
	paused := false
	s.entries.with(e, func(e *entry) { paused = e.status.State == StatePaused })
	if !paused {
		// Paused on the instance that owns it (the status every instance
		// shows), not here: say where to resume it.
		if st := s.ha.fleetView([]Status{s.entries.status(e)}); len(st) == 1 && st[0].State == StatePaused && st[0].Owner != "" {
			return fmt.Errorf("%w: %s is paused on instance %s, not on this one: resume it there", ErrConflict, name, st[0].Owner)
		}
		return fmt.Errorf("%w: %s is not paused", ErrConflict, name)
	}
	return s.life.start(e)
}

// ReloadResult says what a reload did, by pipeline name.
type ReloadResult struct {
	Started   []string `json:"started"`
	Restarted []string `json:"restarted"`
	Stopped   []string `json:"stopped"`
	Unchanged []string `json:"unchanged"`
	// Paused are the pipelines this reload paused, or added paused, as
	// their specs asked (pipelines.Spec.Paused).
	Paused []string `json:"paused,omitempty"`
}

// Reload makes the running set match specs: pipelines no longer there are
// stopped and forgotten, those whose configuration changed are drained and
// restarted, new ones start, and unchanged ones are left alone (no restart,
// no lost position). A spec marked Paused is kept as a paused pipeline
// with no incarnation (its backlog still measured); a later one not marked
// starts it again. A pipeline paused with Pause stays paused, as before.
// Validation happens before: Reload only gets a valid set.
func (s *Supervisor) Reload(specs []*pipelines.Spec) (ReloadResult, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	var r ReloadResult
	want := map[string]*pipelines.Spec{}
	for _, sp := range specs {
		want[sp.Name] = sp
	}
	current := map[string]*entry{}
	for _, e := range s.entries.all() {
		current[e.spec.Name] = e
	}
	var errs []error
	for name := range current {
		if _, keep := want[name]; !keep {
			errs = append(errs, s.stop(name))
			r.Stopped = append(r.Stopped, name)
		}
	}
	for name, sp := range want {
		e, exists := current[name]
		if !exists {
			errs = append(errs, s.add(sp))
			r.add(name, sp.Paused, &r.Started)
			continue
		}
		errs = append(errs, s.reconcile(e, sp, &r))
	}
	for _, l := range [][]string{r.Started, r.Restarted, r.Stopped, r.Unchanged, r.Paused} {
		slices.Sort(l)
	}
	return r, errors.Join(errs...)
}

// add lists name under Paused when paused, else under to.
func (r *ReloadResult) add(name string, paused bool, to *[]string) {
	if paused {
		r.Paused = append(r.Paused, name)
		return
	}
	*to = append(*to, name)
}

// reconcile makes the known pipeline e match sp.
func (s *Supervisor) reconcile(e *entry, sp *pipelines.Spec, r *ReloadResult) error {
	name := sp.Name
	var pausedNow, pausedByDesire bool
	s.entries.with(e, func(e *entry) {
		pausedNow, pausedByDesire = e.status.State == StatePaused, e.spec.Paused
	})
	changed := e.spec.Hash != sp.Hash
	switch {
	case sp.Paused && !pausedNow:
		s.pauseByDesire(e, sp)
		r.Paused = append(r.Paused, name)
		return nil
	case pausedNow && (sp.Paused || !pausedByDesire):
		// Stays paused (by its spec, or by an operator's Pause), with its
		// new configuration: no incarnation runs to read the old one.
		s.replaceSpec(e, sp)
		if changed {
			r.Restarted = append(r.Restarted, name)
		} else {
			r.Unchanged = append(r.Unchanged, name)
		}
		return nil
	case pausedNow:
		// Paused by its previous spec, which this one no longer asks.
		s.replaceSpec(e, sp)
		r.Started = append(r.Started, name)
		return s.startOrWait(e)
	case changed:
		s.life.halt(e)
		s.replaceSpec(e, sp)
		r.Restarted = append(r.Restarted, name)
		return s.startOrWait(e)
	}
	// The same configuration, running: e keeps its spec. An incarnation
	// reads its entry's spec while it runs, so the spec is replaced only
	// while none does (halted above, or paused).
	r.Unchanged = append(r.Unchanged, name)
	return nil
}

// pauseByDesire stops e for good while sp (paused) is its spec: no
// incarnation runs and this instance holds no ownership of it, so every
// instance shows its backlog.
func (s *Supervisor) pauseByDesire(e *entry, sp *pipelines.Spec) {
	s.entries.with(e, func(e *entry) { e.status.Owner = "" })
	s.haltForPause(e)
	s.ha.release(e)
	s.entries.with(e, func(e *entry) { e.inc = nil }) // halted and closed: nothing of it is shown
	s.replaceSpec(e, sp)
	s.entries.probe(e, s.log)
}

// replaceSpec makes sp e's spec.
func (s *Supervisor) replaceSpec(e *entry, sp *pipelines.Spec) {
	s.entries.with(e, func(e *entry) {
		e.spec = sp
		e.status.Tenant, e.status.Source, e.status.Sink = sp.Tenant, sp.Source.Type, sp.Sink.Type
	})
	e.rep.spec.Store(sp) // errors before the restart are masked with the new secrets
}

// startOrWait starts e, unless it runs only while this instance owns it
// and does not: then it waits, starting, for an ownership round.
func (s *Supervisor) startOrWait(e *entry) error {
	waits := false
	s.entries.with(e, func(e *entry) {
		if waits = s.ha.leftToOthers(e); waits && e.status.State == StatePaused {
			e.setState(StateStarting) // the round takes what is not paused
		}
	})
	if waits {
		return nil
	}
	return s.life.start(e)
}
