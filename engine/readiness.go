package engine

// Unready is one thing that does not run as it should: a pipeline this
// instance should run and does not, or the coordination database. /readyz
// lists them (to the callers who may see them) without being decided by
// them: one tenant's broken pipeline, or a database every instance shares,
// must not take every instance out of service.
type Unready struct {
	// Path names what does not run: pipelines.<name>, ha.coordination, or
	// (added by the API) store.
	Path string `json:"path"`
	// Message says why.
	Message string `json:"message"`
	// Pipeline and Tenant are the pipeline's, when Path names one: the API
	// shows a caller only its tenant's.
	Pipeline string `json:"-"`
	Tenant   string `json:"-"`
}

// Serving reports whether the supervisor's router runs: Run started it
// and it is not closed. It is what the engine adds to /readyz's verdict;
// what each pipeline does is not (Readiness).
func (s *Supervisor) Serving() bool {
	select {
	case <-s.router.Running():
	default:
		return false
	}
	return !s.router.IsClosed()
}

// Ready reports whether every pipeline this instance should run runs and
// the coordination database answers (Readiness is empty). It is not
// /readyz's verdict (see Serving); tests and tools wait on it.
func (s *Supervisor) Ready() bool { return len(s.Readiness()) == 0 }

// Readiness lists what does not run as it should; empty when everything
// does: the coordination database when it does not answer (with high
// availability), and every pipeline that is neither running here (a
// stalled one is not), paused by an operator or by its desired state, nor
// standby because another live instance runs it. A pipeline nobody owns
// yet while this instance runs its fair share is another instance's to
// take, and does not count either. /readyz shows these as its details;
// they do not make it 503.
func (s *Supervisor) Readiness() []Unready {
	var out []Unready
	if c, ok := s.Coordination(); ok && !c.Up {
		out = append(out, Unready{Path: "ha.coordination", Message: "coordination database unreachable: " + c.LastError})
	}
	leftToOthers := map[string]bool{}
	s.entries.mu.Lock()
	for name, e := range s.entries.byName {
		leftToOthers[name] = e.status.State == StateStarting && s.ha.leftToOthers(e) && !e.ownerChecked.IsZero()
	}
	s.entries.mu.Unlock()
	for _, st := range s.LocalStatuses() {
		switch {
		case st.State == StateRunning, st.State == StatePaused:
			continue
		case st.State == StateStandby:
			// Another instance holds it, or this one just handed it over to
			// one with room (the next round names the owner).
			continue
		case leftToOthers[st.Name]:
			continue
		}
		msg := string(st.State)
		if st.LastError != "" {
			msg += ": " + st.LastError
		}
		out = append(out, Unready{Path: "pipelines." + st.Name, Message: msg, Pipeline: st.Name, Tenant: st.Tenant})
	}
	return out
}

// RunningCount is how many pipelines run here, and how many this instance
// knows that do not (standby and paused ones count as neither).
func (s *Supervisor) RunningCount() (running, notRunning int) {
	for _, st := range s.LocalStatuses() {
		switch st.State {
		case StateRunning:
			running++
		case StateStandby, StatePaused:
		default:
			notRunning++
		}
	}
	return running, notRunning
}
