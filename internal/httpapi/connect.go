package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/pipelines"
)

// connectTimeout bounds each stage of a connect check: an unreachable host
// answers in this long, not in a TCP timeout.
const connectTimeout = 5 * time.Second

// connectChecks is how many connect checks run at once in the process:
// each opens connections to a database and a broker a caller named, so a
// burst of requests cannot turn the relay into a connection flood.
var connectChecks = make(chan struct{}, 4)

// wantConnect reads ?connect=true: run the connect check before answering
// (validate) or storing (create, update).
func wantConnect(r *http.Request) (bool, *problem) {
	v := r.URL.Query().Get("connect")
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, &problem{code: http.StatusBadRequest, msg: "connect: want true or false",
			details: []detail{{Path: "connect", Message: fmt.Sprintf("%.40q is not true or false", v)}}}
	}
	return on, nil
}

// connectCheck runs the doctor's preflight for a pipeline the caller may
// submit: its secrets are already the tenant's (the request loader) and
// its hosts already passed the tenant's policy, so it reaches nothing the
// pipeline itself could not once stored.
func connectCheck(ctx context.Context, spec *pipelines.Spec) (doctor.Diagnosis, error) {
	select {
	case connectChecks <- struct{}{}:
		defer func() { <-connectChecks }()
	case <-ctx.Done():
		return doctor.Diagnosis{}, fmt.Errorf("too many connect checks at once; retry (%w)", ctx.Err())
	}
	ctx, cancel := context.WithTimeout(ctx, 3*connectTimeout)
	defer cancel()
	return doctor.Preflight(ctx, spec, doctor.Options{Timeout: connectTimeout}), nil
}

// connectDetails are the unhealthy checks of d as problem details: the
// stage (source or sink) as the path, what failed and what to do.
func connectDetails(d doctor.Diagnosis) []detail {
	var out []detail
	for _, c := range d.Checks {
		if c.Status != doctor.Unhealthy {
			continue
		}
		path := "source"
		if c.Stage == doctor.StageBroker {
			path = "sink"
		}
		msg := strings.Join(c.Evidence, "; ")
		if c.Action != "" {
			msg += " — " + c.Action
		}
		out = append(out, detail{Path: path, Message: msg})
	}
	return out
}

// connectProblem is the 422 a create or update with ?connect=true answers
// when the check fails: nothing was stored.
func connectProblem(ctx context.Context, spec *pipelines.Spec) *problem {
	d, err := connectCheck(ctx, spec)
	if err != nil {
		return &problem{code: http.StatusServiceUnavailable, msg: "pipeline " + spec.Name + ": " + err.Error() + "; nothing was changed"}
	}
	if d.Healthy {
		return nil
	}
	return &problem{code: http.StatusUnprocessableEntity,
		msg:     fmt.Sprintf("pipeline %s: the connect check failed at the %s; nothing was changed", spec.Name, stageWord(d.Stage)),
		details: connectDetails(d)}
}

func stageWord(stage string) string {
	if stage == doctor.StageBroker {
		return "broker"
	}
	return "source database"
}
