package engine

// Unready is one reason an instance is not ready.
type Unready struct {
	// Path names what is not ready: pipelines.<name>, or ha.coordination.
	Path string `json:"path"`
	// Message says why.
	Message string `json:"message"`
	// Pipeline and Tenant are the pipeline's, when Path names one: the API
	// shows a caller only its tenant's.
	Pipeline string `json:"-"`
	Tenant   string `json:"-"`
}

// Ready reports whether every pipeline this instance should run runs.
func (s *Supervisor) Ready() bool { return len(s.Readiness()) == 0 }

// Readiness lists why the instance is not ready; empty when it is. It is
// ready when the coordination database answers (with high availability)
// and every pipeline is running here (a stalled one is not), paused by an
// operator or by its desired state, or standby because another live
// instance runs it. A pipeline nobody owns yet while this instance runs
// its fair share is another instance's to take, and does not count either.
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
