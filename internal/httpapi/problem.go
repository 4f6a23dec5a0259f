package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/store"
)

// problem is an API error, answered in the API's one error shape:
// {"error": …, "details": [{path, line, message}]} (details [] when there
// is nothing to point at), with extra fields where a client needs them
// (current_version on a stale If-Match).
type problem struct {
	code    int
	msg     string
	details []detail
	extra   map[string]any
}

// detail points at one problem: a field of the request (or a YAML path),
// and for a file, which one.
type detail struct {
	File    string `json:"file,omitempty"`
	Path    string `json:"path"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

func writeProblem(w http.ResponseWriter, p *problem) {
	if rec, ok := w.(*statusRecorder); ok && rec.reason == "" {
		rec.reason = redact.String(p.msg)
	}
	details := []detail{}
	for _, d := range p.details {
		d.Message, d.Path = redact.String(d.Message), redact.String(d.Path)
		details = append(details, d)
	}
	body := map[string]any{"error": redact.String(p.msg), "details": details}
	for k, v := range p.extra {
		body[k] = v
	}
	writeJSON(w, p.code, body)
}

// storeProblem maps a store error to a response. Anything unexpected is
// the store being unreachable: 503, nothing written.
func storeProblem(err error, what string) *problem {
	var vm *store.VersionMismatchError
	var ve *store.ValidationError
	switch {
	case errors.As(err, &vm):
		return &problem{code: http.StatusConflict, msg: what + ": " + vm.Error() + "; read it again and retry with If-Match: \"" + strconv.FormatInt(vm.Current, 10) + "\"",
			extra: map[string]any{"current_version": vm.Current}}
	case errors.Is(err, store.ErrNotFound):
		return &problem{code: http.StatusNotFound, msg: what + ": not found"}
	case errors.Is(err, store.ErrExists):
		return &problem{code: http.StatusConflict, msg: what + ": already exists"}
	case errors.Is(err, store.ErrForbidden):
		// A name another tenant's pipeline holds (names are global: they
		// name slots and metrics). Say it is taken, not whose it is.
		return &problem{code: http.StatusConflict, msg: what + ": the name is not available", details: []detail{{Path: "name", Message: "already used"}}}
	case errors.Is(err, store.ErrNoKey):
		return &problem{code: http.StatusConflict, msg: what + ": " + err.Error()}
	case errors.As(err, &ve):
		prob := &problem{code: http.StatusUnprocessableEntity, msg: what + ": invalid; nothing was changed"}
		for _, fp := range ve.Problems {
			prob.details = append(prob.details, detail{Path: fp.Path, Message: fp.Message})
		}
		return prob
	case errors.Is(err, store.ErrLimit):
		return &problem{code: http.StatusUnprocessableEntity, msg: err.Error(), details: []detail{{Path: "tenant", Message: err.Error()}}}
	}
	return &problem{code: http.StatusServiceUnavailable, msg: what + ": the store is unavailable; nothing was changed (" + redact.String(err.Error()) + ")"}
}

var identifier = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,47}$`)

func checkName(kind, name string) *problem {
	if identifier.MatchString(name) {
		return nil
	}
	m := fmt.Sprintf("%q is not a %s name: lowercase letters, digits, _ or -, starting with a letter, at most 48 long", name, kind)
	return &problem{code: http.StatusBadRequest, msg: m, details: []detail{{Path: "name", Message: m}}}
}

// ifMatch reads If-Match: a version, quoted as an entity tag or bare. 0
// means none (or *).
func ifMatch(r *http.Request) (int64, *problem) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" || h == "*" {
		return 0, nil
	}
	v, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(h, "W/"), `"`), 10, 64)
	if err != nil || v < 1 {
		return 0, &problem{code: http.StatusBadRequest, msg: "If-Match must be a pipeline version, e.g. \"3\"",
			details: []detail{{Path: "If-Match", Message: fmt.Sprintf("want a version number, got %q", h)}}}
	}
	return v, nil
}

func setETag(w http.ResponseWriter, version int64) {
	if version > 0 {
		w.Header().Set("ETag", `"`+strconv.FormatInt(version, 10)+`"`)
	}
}

func ctxTimeout(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 10*time.Second)
}
