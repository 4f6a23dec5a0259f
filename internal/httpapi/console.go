package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/pipelines"
)

// registerConsole mounts the web console's page at /ui/ (the page itself
// holds no data, so it is open; everything it shows comes from /api/v1
// with the user's token) and, without a store, the history route. With a
// store the history route is one of the control routes.
func (a *api) registerConsole(mux *http.ServeMux) {
	if a.o.Console == nil {
		return
	}
	mux.Handle("GET /ui/", a.o.Console.Handler())
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	if a.o.Control == nil {
		mux.HandleFunc("GET /api/v1/pipelines/{name}/history", func(w http.ResponseWriter, r *http.Request) {
			st, err := a.o.Supervisor.Status(r.PathValue("name"))
			if err != nil {
				writeErr(w, err)
				return
			}
			writeJSON(w, http.StatusOK, a.o.Console.History(st.Name))
		})
	}
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
	ctl := c.o.Control
	var spec *pipelines.Spec
	if v.ManagedBy == managedByFile {
		spec = ctl.Converger.Snapshot().Files[v.Name]
	} else {
		ctx, cancel := ctxTimeout(r)
		row, err := ctl.Store.Pipeline(ctx, v.Name)
		cancel()
		if err != nil {
			writeProblem(w, storeProblem(err, "pipeline "+v.Name))
			return
		}
		specs, err := ctl.Loader.LoadBytes("store:"+v.Name, []byte(row.Config))
		if err != nil || len(specs) != 1 {
			writeProblem(w, &problem{code: http.StatusUnprocessableEntity, msg: "the stored pipeline does not load here", details: loadDetails(err)})
			return
		}
		spec = specs[0]
	}
	if spec == nil {
		writeProblem(w, &problem{code: http.StatusNotFound, msg: "pipeline " + v.Name + " is not loaded on this instance"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	rep := doctor.Run(ctx, []*pipelines.Spec{spec}, doctor.Options{Timeout: 5 * time.Second, Sample: time.Second})
	writeJSON(w, http.StatusOK, rep.Pipelines[0])
}
