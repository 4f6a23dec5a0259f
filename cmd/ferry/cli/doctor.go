package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

func doctorCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("doctor", "-c PATH [-c PATH…] [--url http://127.0.0.1:9090] [--json]", stderr)
	var files paths
	fs.Var(&files, "c", "pipeline file or directory of *.yaml (repeatable)")
	url := fs.String("url", defaultURL, "a running ferry's --http address (a URL, or what --http takes), to read its coordination database and each pipeline's state there; when nothing answers at the default, the doctor looks for the relay's sessions on the source databases")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	tokenFile := fs.String("token-file", "", "file holding the API token for --url (else $FERRY_TOKEN)")
	var o doctor.Options
	fs.DurationVar(&o.MaxAge, "max-age", time.Minute, "oldest undelivered event age that is unhealthy")
	fs.DurationVar(&o.MaxTransactionAge, "max-transaction-age", 5*time.Minute, "oldest running transaction age that blocks xid8")
	fs.Int64Var(&o.MaxConsumerLag, "max-consumer-lag", 1000, "unconsumed messages per consumer group that are unhealthy")
	fs.DurationVar(&o.Sample, "sample", 2*time.Second, "gap between two backlog measurements (0: one)")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Second, "bound on each check")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	files = append(files, fs.Args()...)
	specs, err := pipelines.Load(files...)
	if err != nil {
		for _, e := range plugins.Flatten(err) {
			fmt.Fprintln(stderr, e)
		}
		return 2
	}
	o.URL = apiURL(*url)
	if o.Token, err = apiToken(*tokenFile); err != nil {
		fmt.Fprintf(stderr, "ferry doctor: %v\n", err)
		return 2
	}
	o.URLIsDefault = true
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "url" {
			o.URLIsDefault = false
		}
	})
	r := doctor.Run(context.Background(), specs, o)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	} else {
		r.Print(stdout)
	}
	return r.ExitCode()
}
