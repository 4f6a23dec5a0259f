package httpapi

import "net/http"

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
