package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/pipelines"
)

// registerConsole mounts the web console's page at /ui/: the page itself
// holds no data, so it is open; everything it shows comes from /api/v1
// with the user's token (the history route is one of the /api/v1 routes).
func (a *api) registerConsole(mux *http.ServeMux) {
	if a.o.Console == nil {
		return
	}
	mux.Handle("GET /ui/", a.o.Console.Handler())
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}

// history answers a pipeline's lag history and stage counts to a caller
// that may read the pipeline.
func (c *api) history(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	if c.o.Console == nil {
		writeProblem(w, &problem{code: http.StatusNotFound, msg: "the console is off (ferry run --ui=false): no history is kept"})
		return
	}
	writeJSON(w, http.StatusOK, c.o.Console.History(v.Name))
}

// diagnose walks one pipeline with the doctor (database, relay, source
// position, broker, consumers), as `ferry doctor` does, and answers the
// walk: the checks up to the first unhealthy stage with its suggested fix.
func (c *api) diagnose(w http.ResponseWriter, r *http.Request, p principal) {
	v, _, ok := c.find(w, r, p)
	if !ok {
		return
	}
	// The definition as the API loads it: a file's as loaded, a store
	// pipeline's with its tenant's secrets (never the server's environment).
	spec, prob := c.sourceOf(v)
	if prob != nil {
		writeProblem(w, readProblem(prob, v.Name))
		return
	}
	ctx, cancel := context.WithTimeout(c.tenantDial(r.Context(), tenantPipeline(v)), 30*time.Second)
	defer cancel()
	// The walk asks the broker about every queue and group the pipeline
	// names, and connects where it says: a tenant's pipeline is walked
	// only while its tenant's policy allows it, which may have changed
	// since it was stored (and its answer would say whose queue is how
	// deep, or missing).
	o := doctor.Options{Timeout: 5 * time.Second, Sample: time.Second, Local: c.o.Supervisor.Status}
	if v.ManagedBy != managedByFile && spec.Tenant != "" {
		if prob := c.checkPolicy(ctx, spec); prob != nil {
			prob.msg = fmt.Sprintf("pipeline %s: not allowed by tenant %s's policy, so it is not diagnosed", spec.Name, spec.Tenant)
			writeProblem(w, prob)
			return
		}
		o.Destinations = c.o.Control.Converger.TenantPolicy(spec.Tenant).AllowsDestination
	}
	rep := doctor.Run(ctx, []*pipelines.Spec{spec}, o)
	writeJSON(w, http.StatusOK, rep.Pipelines[0])
}

// readProblem says what a failed read of a store pipeline's definition
// means for a read: storeProblem words a store failure for writes
// ("nothing was changed"), which a doctor's read never tries. Still 503:
// asked again once the store is back, it answers.
func readProblem(prob *problem, name string) *problem {
	const write = "the store is unavailable; nothing was changed ("
	if prob.code != http.StatusServiceUnavailable || !strings.Contains(prob.msg, write) {
		return prob
	}
	cause := strings.TrimSuffix(prob.msg[strings.Index(prob.msg, write)+len(write):], ")")
	return &problem{code: http.StatusServiceUnavailable,
		msg: "pipeline " + name + ": the store is unreachable, so its definition cannot be read to diagnose it; retry once the store is back (" + cause + ")"}
}
