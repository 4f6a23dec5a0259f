package httpapi

import (
	"net/http"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/store"
)

// readiness is /readyz's verdict: whether this instance can do its job —
// its router runs and it has its configuration. Nothing that one tenant's
// pipeline does, nor a database every instance shares (the store, the
// coordination database), decides it: either would take every instance
// out of a load balancer at once, the API and console with them.
// docs/ha.md "Readiness" is the contract.
type readiness struct {
	// Router is "ok" while the supervisor's router runs, else why not.
	Router string `json:"router"`
	// Configuration is "ok" once the pipeline files were loaded and, with
	// a store, the store was read at least once since start.
	Configuration string `json:"configuration"`
}

func (r readiness) ok() bool { return r.Router == "ok" && r.Configuration == "ok" }

func (a *api) readiness() readiness {
	r := readiness{Router: "ok", Configuration: "ok"}
	if !a.o.Supervisor.Serving() {
		r.Router = "not running"
	}
	// The files were loaded before the API was built (a file that does not
	// load fails the start); a store must have answered once: until then
	// this instance knows neither the store's pipelines nor its tokens.
	if a.o.Control.Store != nil && a.o.Control.Converger.Snapshot().ReadAt.IsZero() {
		r.Configuration = "waiting for the control-plane store's first read"
	}
	return r
}

// ready answers 200 when the instance can do its job (readiness), else
// 503. Whatever the answer, the body counts the pipelines that run and do
// not; without a token that is all, besides the checks: the probe is open,
// and pipeline names and errors are tenant data. With a token it names in
// details each pipeline the token may see that does not run, and, for an
// admin or a reader, the coordination database and the store when they do
// not answer — information that does not change the verdict.
func (a *api) ready(w http.ResponseWriter, r *http.Request) {
	verdict := a.readiness()
	running, notRunning := a.o.Supervisor.RunningCount()
	body := map[string]any{"status": "ready", "checks": verdict, "pipelines": map[string]int{"running": running, "not_running": notRunning}}
	code := http.StatusOK
	if !verdict.ok() {
		body["status"], code = "not ready", http.StatusServiceUnavailable
	}
	if r.Header.Get("Authorization") != "" || a.openReads() {
		scope := store.ScopeAdmin // no token exists: every read is open
		if !a.openReads() {
			var ok bool
			if scope, ok = a.caller(w, r); !ok {
				return
			}
		}
		body["details"] = a.readyDetails(scope)
	}
	writeJSON(w, code, body)
}

// readyDetails is what does not run as it should, as scope may see it.
func (a *api) readyDetails(scope store.Scope) []engine.Unready {
	why := a.o.Supervisor.Readiness()
	if snap := a.o.Control.Converger.Snapshot(); a.o.Control.Store != nil && snap.Stale {
		why = append(why, engine.Unready{Path: "store",
			Message: "control-plane store unreachable since " + snap.StaleSince.UTC().Format(time.RFC3339) + ": " + snap.ReadError})
	}
	details := []engine.Unready{}
	for _, u := range why {
		if u.Tenant == "" && u.Pipeline == "" && scope != store.ScopeAdmin && scope != store.ScopeRead {
			continue // the process's own state: for admins and readers
		}
		if u.Pipeline != "" && !scope.CanSeeTenant(u.Tenant) {
			continue
		}
		details = append(details, u)
	}
	return details
}

// storeState is the control-plane store as this instance last found it:
// GET /api/v1/pipelines's store.
type storeState struct {
	Up        bool       `json:"up"`
	ReadAt    *time.Time `json:"read_at,omitempty"`
	Since     *time.Time `json:"since,omitempty"`
	LastError string     `json:"last_error,omitempty"`
}

func storeStateOf(snap store.Snapshot) storeState {
	st := storeState{Up: !snap.Stale && !snap.ReadAt.IsZero(), LastError: snap.ReadError}
	if !snap.ReadAt.IsZero() {
		t := snap.ReadAt.UTC()
		st.ReadAt = &t
	}
	if snap.Stale {
		t := snap.StaleSince.UTC()
		st.Since = &t
	}
	return st
}
