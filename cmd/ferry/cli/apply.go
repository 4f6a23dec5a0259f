package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/store"
)

// applyPlan carries out a plan, each step guarded by the version the plan
// saw: a pipeline someone changed since is refused, not overwritten.
func applyPlan(c *apiClient, plan []planStep, connect bool) ([]planStep, error) {
	query := ""
	if connect {
		query = "?connect=true"
	}
	var errs []error
	done := make([]planStep, 0, len(plan))
	for _, s := range plan {
		var out struct {
			Pipeline store.Pipeline `json:"pipeline"`
		}
		var err error
		path := "/pipelines/" + url.PathEscape(s.Pipeline)
		if tenant, ok := strings.CutPrefix(s.Pipeline, tenantStep); ok {
			if s.Action != "unchanged" {
				var t store.Tenant
				hdr := []string{}
				if s.Version > 0 {
					hdr = []string{"If-Match", fmt.Sprintf("%q", strconv.FormatInt(s.Version, 10))}
				}
				_, err = c.call("PUT", "/tenants/"+url.PathEscape(tenant), "application/json", s.text, &t, hdr...)
				s.Version = t.Version
			}
			if err != nil {
				s.Error = err.Error()
				errs = append(errs, fmt.Errorf("%s %s: %w", s.Action, s.Pipeline, err))
			}
			done = append(done, s)
			continue
		}
		switch s.Action {
		case "create":
			_, err = c.call("POST", "/pipelines"+query, "application/yaml", s.text, &out)
			s.Version = out.Pipeline.Version
		case "update":
			_, err = c.call("PUT", path+"/config"+query, "application/yaml", s.text, &out, "If-Match", fmt.Sprintf("%q", strconv.FormatInt(s.Version, 10)))
			s.Version = out.Pipeline.Version
		case "delete":
			_, err = c.call("DELETE", path, "", nil, nil, "If-Match", fmt.Sprintf("%q", strconv.FormatInt(s.Version, 10)))
		}
		if err != nil {
			s.Error = err.Error()
			errs = append(errs, fmt.Errorf("%s %s: %w", s.Action, s.Pipeline, err))
		}
		done = append(done, s)
	}
	return done, errors.Join(errs...)
}

// printPlan prints a plan's steps and what they would do.
func printPlan(w io.Writer, plan []planStep) {
	counts := map[string]int{}
	for _, s := range plan {
		counts[s.Action]++
		printStep(w, s)
	}
	fmt.Fprintf(w, "Plan: %d to create, %d to update, %d to delete, %d unchanged.\n", counts["create"], counts["update"], counts["delete"], counts["unchanged"])
}

// printApplied prints what apply did: the summary counts the steps that
// succeeded and, apart, those that failed.
func printApplied(w io.Writer, done []planStep) {
	counts := map[string]int{}
	failed := 0
	for _, s := range done {
		if s.Error != "" {
			failed++
		} else {
			counts[s.Action]++
		}
		printStep(w, s)
	}
	fmt.Fprintf(w, "Applied: %d created, %d updated, %d deleted, %d unchanged; %d failed.\n",
		counts["create"], counts["update"], counts["delete"], counts["unchanged"], failed)
}

func printStep(w io.Writer, s planStep) {
	sign := map[string]string{"create": "+", "update": "~", "delete": "-", "unchanged": "="}[s.Action]
	if s.Error != "" {
		sign = "!"
	}
	line := fmt.Sprintf("%s %s %s", sign, s.Action, s.Pipeline)
	if s.File != "" {
		line += "  (" + s.File + ")"
	}
	if s.Error != "" {
		line += "  FAILED: " + strings.ReplaceAll(s.Error, "\n", "\n    ")
	}
	fmt.Fprintln(w, line)
	for _, c := range s.Changes {
		fmt.Fprintf(w, "    %s\n", c)
	}
}
