package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// doctorCmd walks each pipeline's path and names the first unhealthy
// stage. Without -c it asks a running ferry (GET /api/v1/pipelines, then
// GET /api/v1/pipelines/{name}/doctor for each, the walk done where the
// pipeline runs), the same with or without its --store; with -c it walks
// the files' pipelines from here, reading their state from --url when
// something answers there. A positional argument is a file when one
// exists at that path, else a pipeline's name: `ferry doctor orders`
// asks the running ferry about orders, wherever it is defined.
func doctorCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("doctor", "[NAME…] [-c PATH…] [--url URL] [--token-file F] [--pipeline NAME…] [--json]", stderr)
	var files, names paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable): walk these from here; without it, the running ferry at --url walks its own")
	fs.Var(&names, "pipeline", "only this pipeline (repeatable; default every one the token may see, or every one in the files); a positional NAME is the same")
	var af apiFlags
	af.register(fs)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	var o doctor.Options
	fs.DurationVar(&o.MaxAge, "max-age", time.Minute, "with -c: oldest undelivered event age that is unhealthy")
	fs.DurationVar(&o.MaxTransactionAge, "max-transaction-age", 5*time.Minute, "with -c: oldest running transaction age that blocks xid8")
	fs.Int64Var(&o.MaxConsumerLag, "max-consumer-lag", 1000, "with -c: unconsumed messages per consumer group that are unhealthy")
	fs.DurationVar(&o.Sample, "sample", 2*time.Second, "with -c: gap between two backlog measurements (0: one)")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Second, "bound on each check")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	for _, a := range fs.Args() {
		if _, err := os.Stat(a); err == nil {
			files = append(files, a)
		} else {
			names = append(names, a)
		}
	}
	c, err := af.client()
	if err != nil {
		fmt.Fprintf(stderr, "ferry doctor: %v\n", err)
		return 2
	}
	o.URL, o.Token = apiURL(af.url), c.token
	// Asked for neither by flag nor by $FERRY_URL: when nothing answers
	// there, the doctor looks for the relay's sessions on the databases.
	o.URLIsDefault = os.Getenv("FERRY_URL") == ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "url" {
			o.URLIsDefault = false
		}
	})
	var r doctor.Report
	if len(files) == 0 {
		if r, err = remoteDoctor(c, o, names); err != nil {
			fmt.Fprintf(stderr, "ferry doctor: %v\n", err)
			return 2
		}
	} else {
		specs, err := pipelines.Load(files...)
		if err != nil {
			for _, e := range plugins.Flatten(err) {
				fmt.Fprintln(stderr, e)
			}
			return 2
		}
		if specs, err = only(specs, names); err != nil {
			fmt.Fprintf(stderr, "ferry doctor: %v\n", err)
			return 2
		}
		r = doctor.Run(context.Background(), specs, o)
	}
	switch {
	case *asJSON || af.output == "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	case af.output == "yaml":
		_ = printAs(stdout, "yaml", r)
	default:
		r.Print(stdout)
	}
	return r.ExitCode()
}

// remoteDoctor asks the running ferry to walk its pipelines (those named,
// else every one the token may see), a few at once: each walk takes
// seconds. The instance's coordination database is judged from its list,
// as doctor.Run judges it.
func remoteDoctor(c *apiClient, o doctor.Options, names []string) (doctor.Report, error) {
	var list struct {
		Pipelines []struct {
			Name   string `json:"name"`
			Tenant string `json:"tenant"`
		} `json:"pipelines"`
	}
	if _, err := c.call("GET", "/pipelines", "", nil, &list); err != nil {
		var netErr *url.Error
		if errors.As(err, &netErr) {
			err = fmt.Errorf("%w\n  nothing answers at %s: give the running ferry's --http address with --url (or $FERRY_URL), or -c FILES to walk them from here", err, o.URL)
		}
		return doctor.Report{}, err
	}
	o.URLIsDefault = false // it answered
	r := doctor.Run(context.Background(), nil, o)
	var todo []doctor.Diagnosis
	for _, p := range list.Pipelines {
		if len(names) == 0 || slices.Contains(names, p.Name) {
			todo = append(todo, doctor.Diagnosis{Pipeline: p.Name, Tenant: p.Tenant})
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(todo, func(d doctor.Diagnosis) bool { return d.Pipeline == n }) {
			return r, fmt.Errorf("no pipeline %q at %s (or the token may not see it)", n, o.URL)
		}
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, 4)
	for i := range todo {
		wg.Add(1)
		slots <- struct{}{}
		go func(d *doctor.Diagnosis) {
			defer func() { <-slots; wg.Done() }()
			if _, err := c.call("GET", "/pipelines/"+url.PathEscape(d.Pipeline)+"/doctor", "", nil, d); err != nil {
				d.Checks = []doctor.Check{{Stage: doctor.StageBacklog, Status: doctor.Unknown, Evidence: []string{"the running ferry could not walk it: " + err.Error()}}}
			}
		}(&todo[i])
	}
	wg.Wait()
	r.Pipelines = todo
	return r, nil
}

// only keeps the specs named (all of them when none is), and says which
// name no file defines.
func only(specs []*pipelines.Spec, names []string) ([]*pipelines.Spec, error) {
	if len(names) == 0 {
		return specs, nil
	}
	var kept []*pipelines.Spec
	for _, n := range names {
		i := slices.IndexFunc(specs, func(s *pipelines.Spec) bool { return s.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("no pipeline %q in the files given (nor a file at that path)", n)
		}
		kept = append(kept, specs[i])
	}
	return kept, nil
}
