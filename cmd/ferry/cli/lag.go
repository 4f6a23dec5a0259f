package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/plugins"
)

// lagCmd prints a running ferry's pipelines as GET /api/v1/pipelines
// answers them — the same with or without --store: a table for people,
// -o json or yaml for scripts.
func lagCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("lag", "[--url URL] [--token-file F] [--watch 2s] [-o table|json|yaml]", stderr)
	var af apiFlags
	af.register(fs)
	watch := fs.Duration("watch", 0, "refresh in place at this interval (0: print once)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	c, err := af.client()
	if err != nil {
		fmt.Fprintf(stderr, "ferry lag: %v\n", err)
		return 2
	}
	for {
		var raw []byte
		if _, err := c.call("GET", "/pipelines", "", nil, &raw); err != nil {
			fmt.Fprintf(stderr, "ferry lag: %v\n", err)
			return 2
		}
		var body lagList
		if err := json.Unmarshal(raw, &body); err != nil {
			fmt.Fprintf(stderr, "ferry lag: GET /api/v1/pipelines: %v\n", err)
			return 2
		}
		if *watch > 0 {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear and home: refresh in place
			fmt.Fprintf(stdout, "%s  %s  (every %s, Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), apiURL(af.url), *watch)
		}
		if af.output == "table" {
			printCoordination(stdout, body.Coordination)
			printStore(stdout, body.Store)
			printLag(stdout, body.Pipelines)
		} else {
			var generic any
			_ = json.Unmarshal(raw, &generic)
			if err := printAs(stdout, af.output, generic); err != nil {
				fmt.Fprintf(stderr, "ferry lag: %v\n", err)
				return 2
			}
		}
		if *watch <= 0 {
			return 0
		}
		time.Sleep(*watch)
	}
}

// lagList is the part of GET /api/v1/pipelines the table shows: each
// pipeline's status on the instance asked, file and store pipelines alike.
type lagList struct {
	Pipelines    []engine.Status      `json:"pipelines"`
	Coordination *engine.Coordination `json:"coordination"`
	Store        *storeState          `json:"store"`
}

// storeState is the control-plane store as the instance asked last found
// it (with --store).
type storeState struct {
	Up        bool       `json:"up"`
	ReadAt    *time.Time `json:"read_at"`
	Since     *time.Time `json:"since"`
	LastError string     `json:"last_error"`
}

// printStore says, above the table, when the instance cannot read its
// store: the rows are then what it last read, and no change can be made.
func printStore(w io.Writer, s *storeState) {
	if s == nil || s.Up {
		return
	}
	since, last := "its start", "never"
	if s.Since != nil {
		since = s.Since.Format(time.RFC3339)
	}
	if s.ReadAt != nil {
		last = s.ReadAt.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "STORE DOWN since %s: %s\n  pipelines run as last read (at %s); changes are refused until it is back\n\n",
		since, strings.ReplaceAll(strings.TrimSpace(s.LastError), "\n", "\n  "), last)
}

// defaultURL is where the API commands look for a running ferry when
// neither --url nor $FERRY_URL says: `ferry run --http 9090`.
const defaultURL = "http://127.0.0.1:9090"

// apiURL accepts what --http accepts — a bare port, :port, host:port — as
// well as a URL, and returns a URL.
func apiURL(s string) string {
	if strings.Contains(s, "://") {
		return s
	}
	return "http://" + listenAddr(s)
}

// printCoordination says, above the table, when high availability runs
// degraded: every pipeline's row may look fine while the instance is not.
func printCoordination(w io.Writer, c *engine.Coordination) {
	if c == nil || c.Up {
		return
	}
	fmt.Fprintf(w, "HA DEGRADED since %s: coordination database %s unreachable: %s\n  this instance %s\n\n",
		c.Since.Format(time.RFC3339), c.Database, c.LastError, c.Degraded)
}

// printLag writes one row per pipeline: state, backlog, oldest age, the
// delivery rate and the backlog's ETA, the publishes the broker answered
// as duplicates ("-" where it cannot say), and each lag segment's p50/p99
// over the last minute. A pipeline's notes (its last error, a backlog that
// cannot be measured) follow its row outside the columns, each line of a
// multi-line error indented under the first, so rows stay aligned.
func printLag(w io.Writer, sts []engine.Status) {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PIPELINE\tTENANT\tSTATE\tON\tBACKLOG\tOLDEST\tMEASURED\tRATE\tETA\tDUPLICATES\tCOMMIT→READ p50/p99\tREAD→ACK p50/p99\tCOMMIT→ACK p50/p99\tACK→CONSUMED p50/p99")
	notes := make([][]string, len(sts))
	for i, s := range sts {
		fmt.Fprintln(tw, strings.Join(lagRow(s), "\t"))
		if s.LastError != "" && s.State != engine.StateRunning {
			next := ""
			if !s.NextRetry.IsZero() {
				next = fmt.Sprintf(" (next retry in %s)", max(time.Until(s.NextRetry), 0).Round(100*time.Millisecond))
			}
			notes[i] = append(notes[i], s.LastError+next)
		}
		if h := s.Health; h != nil && h.Failing() {
			notes[i] = append(notes[i], "backlog cannot be measured: "+h.MeasureError)
		}
	}
	tw.Flush()
	lines := strings.SplitAfter(table.String(), "\n")
	io.WriteString(w, lines[0])
	for i, line := range lines[1:] {
		io.WriteString(w, line)
		if i < len(notes) {
			for _, n := range notes[i] {
				fmt.Fprintf(w, "  └ %s\n", strings.ReplaceAll(strings.TrimRight(n, "\n"), "\n", "\n    "))
			}
		}
	}
}

// lagRow is a pipeline's cells.
func lagRow(s engine.Status) []string {
	backlog, oldest, measured := backlogCells(s.Health)
	rate, eta := progressCells(s.Progress)
	// ON is where the pipeline runs, for every row: the instance asked
	// answers for all, so the reader needs to know whose status it is.
	on := cmpOr(s.Owner, "-")
	dups := "-"
	if s.Duplicates != nil {
		dups = fmt.Sprint(*s.Duplicates)
	}
	row := []string{s.Name, s.Tenant, string(s.State), on, backlog, oldest, measured, rate, eta, dups}
	for _, seg := range plugins.Segments {
		l := s.Lag[seg]
		if l.Count == 0 {
			row = append(row, "-")
			continue
		}
		row = append(row, fmt.Sprintf("%s / %s", seconds(l.P50), seconds(l.P99)))
	}
	return row
}

// backlogCells are the backlog, oldest-age and measured-ago cells: "-" for
// a backlog never measured, and FAILING (with the last good measurement's
// age) for one that cannot be measured now — never its last value.
func backlogCells(h *plugins.Health) (backlog, oldest, measured string) {
	switch {
	case h == nil || (h.CheckedAt.IsZero() && !h.Failing()):
		return "-", "-", "-"
	case h.Failing():
		measured = "never"
		if !h.CheckedAt.IsZero() {
			measured = time.Since(h.CheckedAt).Round(time.Second).String() + " ago"
		}
		return "FAILING", "?", measured
	}
	return fmt.Sprintf("%d %s", h.Backlog, h.BacklogUnit), h.OldestAge.Round(time.Millisecond).String(),
		time.Since(h.CheckedAt).Round(time.Second).String() + " ago"
}

// progressCells are the delivery rate and the backlog's ETA cells.
func progressCells(p *engine.Progress) (rate, eta string) {
	if p == nil {
		return "-", "-"
	}
	rate, eta = fmt.Sprintf("%.0f/s", p.DeliveredPerSecond), "-"
	if p.ETASeconds != nil {
		eta = time.Duration(*p.ETASeconds * float64(time.Second)).Round(time.Second).String()
	}
	return rate, eta
}

func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Microsecond).String()
}
