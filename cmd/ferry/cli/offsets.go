package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// offsetFlags are the flags of pipelines offsets, reset and dead-letters.
type offsetFlags struct {
	toTime, toPosition, reason string
	toLatest, dryRun, replay   bool
	limit                      int
	from, to                   string
	aggType, aggID, eventType  string
}

func registerOffsetFlags(fs interface {
	StringVar(*string, string, string, string)
	BoolVar(*bool, string, bool, string)
	IntVar(*int, string, int, string)
}) *offsetFlags {
	var o offsetFlags
	fs.StringVar(&o.toTime, "to-time", "", "reset: deliver from the first event created at or after this RFC 3339 time (again)")
	fs.StringVar(&o.toPosition, "to-position", "", `reset: move to the source's own position, as JSON (xid8 {"xact_id":"…","id":N}, poll {"id":N}, wal {"lsn":"…"})`)
	fs.BoolVar(&o.toLatest, "to-latest", false, "reset: skip everything not yet delivered")
	fs.BoolVar(&o.dryRun, "dry-run", false, "reset, backfill, dead-letters --replay: say what would happen, change nothing")
	fs.BoolVar(&o.replay, "replay", false, "dead-letters: unpark them (poll), and republish the dead-letter topic's to their destinations, each once more")
	fs.StringVar(&o.reason, "reason", "", "dead-letters: only those whose reason contains this")
	fs.IntVar(&o.limit, "limit", 0, "dead-letters: at most this many (listing: 100 by default; --replay: all)")
	fs.StringVar(&o.from, "from", "", "backfill: events created at or after this RFC 3339 time")
	fs.StringVar(&o.to, "to", "", "backfill: events created before this RFC 3339 time")
	fs.StringVar(&o.aggType, "aggregate-type", "", "backfill: only this aggregate type")
	fs.StringVar(&o.aggID, "aggregate-id", "", "backfill: only this aggregate")
	fs.StringVar(&o.eventType, "type", "", "backfill: only this event type")
	return &o
}

// offsetsSub runs pipelines offsets, reset, backfill and dead-letters.
func offsetsSub(sub, name string, o *offsetFlags, c *apiClient, format string, stdout, stderr io.Writer) int {
	r := offsetsRun{name: name, base: "/pipelines/" + url.PathEscape(name), o: o, c: c, format: format, stdout: stdout, stderr: stderr,
		fail: func(err error) int {
			fmt.Fprintf(stderr, "ferry pipelines %s: %v\n", sub, err)
			return 1
		}}
	switch sub {
	case "offsets":
		return r.offsets()
	case "reset":
		return r.reset()
	case "backfill":
		return r.backfill()
	case "dead-letters":
		if o.replay {
			return r.replayDeadLetters()
		}
		return r.deadLetters()
	}
	return 0
}

// offsetsRun is one run of an offsets subcommand on one pipeline.
type offsetsRun struct {
	name, base     string // the pipeline, and its API path
	o              *offsetFlags
	c              *apiClient
	format         string
	stdout, stderr io.Writer
	fail           func(error) int
}

// offsets prints the pipeline's position and backfills.
func (r offsetsRun) offsets() int {
	var out map[string]any
	if _, err := r.c.call("GET", r.base+"/offsets", "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.format != "table" {
		return exitOf(printAs(r.stdout, r.format, out))
	}
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pipeline\t%v\nsource\t%v\n", out["pipeline"], out["source"])
	pos, _ := out["position"].(map[string]any)
	keys := make([]string, 0, len(pos))
	for k := range pos {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%v\n", k, orDash(pos[k]))
	}
	fmt.Fprintf(tw, "newest_delivered_created_at\t%v\n", orDash(out["newest_delivered_created_at"]))
	if bfs, ok := out["backfills"].([]any); ok {
		for _, b := range bfs {
			m, _ := b.(map[string]any)
			what := "backfill"
			if m["reset"] == true {
				what = "reset to a time"
			}
			fmt.Fprintf(tw, "%s %v\t%v of %v events sent (%s)\n", what, m["id"], m["sent_events"], m["total_events"], compact(m["filter"]))
		}
	}
	if n, ok := out["note"].(string); ok && n != "" {
		fmt.Fprintf(tw, "note\t%s\n", n)
	}
	return exitOf(tw.Flush())
}

// resetBody is the PATCH /offsets body the reset flags say, or the exit
// code of a usage error (printed).
func (r offsetsRun) resetBody() (map[string]any, int) {
	o := r.o
	body := map[string]any{}
	set := 0
	if o.toTime != "" {
		if _, err := time.Parse(time.RFC3339Nano, o.toTime); err != nil {
			fmt.Fprintf(r.stderr, "ferry pipelines reset: --to-time %q is not an RFC 3339 time (e.g. 2026-11-30T12:00:00Z)\n", o.toTime)
			return nil, 2
		}
		body["to"], body["time"] = "time", o.toTime
		set++
	}
	if o.toPosition != "" {
		var pos map[string]any
		dec := json.NewDecoder(strings.NewReader(o.toPosition))
		dec.UseNumber()
		if err := dec.Decode(&pos); err != nil {
			fmt.Fprintf(r.stderr, "ferry pipelines reset: --to-position must be a JSON object: %v\n", err)
			return nil, 2
		}
		body["to"], body["position"] = "position", pos
		set++
	}
	if o.toLatest {
		body["to"] = "latest"
		set++
	}
	if set != 1 {
		fmt.Fprintln(r.stderr, "ferry pipelines reset: give exactly one of --to-time, --to-position, --to-latest")
		return nil, 2
	}
	return body, 0
}

// reset moves the pipeline's position (it must be paused).
func (r offsetsRun) reset() int {
	body, code := r.resetBody()
	if body == nil {
		return code
	}
	raw, _ := json.Marshal(body)
	path := r.base + "/offsets"
	if r.o.dryRun {
		path += "?dry_run=true"
	}
	var out map[string]any
	if _, err := r.c.call("PATCH", path, "application/json", raw, &out); err != nil {
		return r.fail(err)
	}
	if r.format != "table" {
		return exitOf(printAs(r.stdout, r.format, out))
	}
	verb := "reset"
	if r.o.dryRun {
		verb = "dry run (nothing changed)"
	}
	fmt.Fprintf(r.stdout, "%s: %s: %v events re-sent, %v skipped\n  from %s\n  to   %s\n", r.name, verb,
		out["resend_events"], out["skip_events"], compact(out["from"]), compact(out["to"]))
	if n, ok := out["note"].(string); ok && n != "" {
		fmt.Fprintln(r.stdout, "  note:", n)
	}
	if !r.o.dryRun {
		fmt.Fprintf(r.stdout, "resume it to deliver from there: ferry pipelines resume %s\n", r.name)
	}
	return 0
}

// backfill queues past events for sending again.
func (r offsetsRun) backfill() int {
	o := r.o
	body := map[string]any{}
	for k, v := range map[string]string{"from": o.from, "to": o.to, "aggregate_type": o.aggType, "aggregate_id": o.aggID, "type": o.eventType} {
		if v != "" {
			body[k] = v
		}
	}
	if len(body) == 0 {
		fmt.Fprintln(r.stderr, "ferry pipelines backfill: give --from/--to or --aggregate-type, --aggregate-id, --type")
		return 2
	}
	raw, _ := json.Marshal(body)
	path := r.base + "/backfill"
	if o.dryRun {
		path += "?dry_run=true"
	}
	var out map[string]any
	if _, err := r.c.call("POST", path, "application/json", raw, &out); err != nil {
		return r.fail(err)
	}
	if r.format != "table" {
		return exitOf(printAs(r.stdout, r.format, out))
	}
	verb := "queued for sending again (header ferry-replay: true)"
	if o.dryRun {
		verb = "would be sent again (dry run)"
	}
	fmt.Fprintf(r.stdout, "%s: %v events %s\n", r.name, out["backfill_events"], verb)
	if n, ok := out["note"].(string); ok && n != "" {
		fmt.Fprintln(r.stdout, "  note:", n)
	}
	return 0
}

// deadLetterQuery is the query string of the dead-letter routes.
func (r offsetsRun) deadLetterQuery() string {
	q := url.Values{}
	if r.o.reason != "" {
		q.Set("reason", r.o.reason)
	}
	if r.o.limit > 0 {
		q.Set("limit", strconv.Itoa(r.o.limit))
	}
	if r.o.replay && r.o.dryRun {
		q.Set("dry_run", "true")
	}
	if len(q) > 0 {
		return "?" + q.Encode()
	}
	return ""
}

// replayDeadLetters unparks and republishes the dead letters.
func (r offsetsRun) replayDeadLetters() int {
	var out map[string]any
	if _, err := r.c.call("POST", r.base+"/dead-letters/replay"+r.deadLetterQuery(), "", nil, &out); err != nil {
		return r.fail(err)
	}
	if r.format != "table" {
		return exitOf(printAs(r.stdout, r.format, out))
	}
	verb := "replayed"
	if r.o.dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(r.stdout, "%s: %s %v dead letters: outbox ids %s\n", r.name, verb, out["replayed_events"], compact(out["outbox_ids"]))
	if d, ok := out["dead_letter_topic"].(map[string]any); ok {
		fmt.Fprintf(r.stdout, "dead-letter topic %v: %s %v, kept %v, event ids %s\n", d["topic"], verb, d["replayed_events"], d["kept_events"], compact(d["event_ids"]))
		if n, _ := d["duplicate_events"].(float64); n > 0 {
			fmt.Fprintf(r.stdout, "  %v of them the broker answered as duplicates of messages it already held: not stored again\n", n)
		}
		if n, _ := d["note"].(string); n != "" {
			fmt.Fprintf(r.stdout, "note: %s\n", n)
		}
	}
	return 0
}

// deadLetterList is GET /dead-letters' answer.
type deadLetterList struct {
	Total           int64 `json:"total"`
	Note            string
	DeadLetterTopic *struct {
		Topic string `json:"topic"`
		Count *int64 `json:"count"`
		Note  string `json:"note"`
	} `json:"dead_letter_topic"`
	DeadLetters []struct {
		OutboxID      int64     `json:"outbox_id"`
		AggregateType string    `json:"aggregate_type"`
		AggregateID   string    `json:"aggregate_id"`
		Type          string    `json:"type"`
		CreatedAt     time.Time `json:"created_at"`
		Attempts      int       `json:"attempts"`
		Reason        string    `json:"reason"`
	} `json:"dead_letters"`
}

// deadLetters lists the dead letters.
func (r offsetsRun) deadLetters() int {
	var raw []byte
	if _, err := r.c.call("GET", r.base+"/dead-letters"+r.deadLetterQuery(), "", nil, &raw); err != nil {
		return r.fail(err)
	}
	if r.format != "table" {
		var v any
		_ = json.Unmarshal(raw, &v)
		return exitOf(printAs(r.stdout, r.format, v))
	}
	var out deadLetterList
	if err := json.Unmarshal(raw, &out); err != nil {
		return r.fail(err)
	}
	tw := tabwriter.NewWriter(r.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTBOX_ID\tAGGREGATE\tTYPE\tCREATED_AT\tATTEMPTS\tREASON")
	for _, d := range out.DeadLetters {
		fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%d\t%s\n", d.OutboxID, d.AggregateType, d.AggregateID, d.Type,
			d.CreatedAt.UTC().Format(time.RFC3339), d.Attempts, d.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintf(r.stdout, "%d shown of %d", len(out.DeadLetters), out.Total)
	if out.Note != "" {
		fmt.Fprintf(r.stdout, " (%s)", out.Note)
	}
	if d := out.DeadLetterTopic; d != nil {
		count := "unknown"
		if d.Count != nil {
			count = strconv.FormatInt(*d.Count, 10)
		}
		fmt.Fprintf(r.stdout, "\ndead-letter topic %s: %s waiting", d.Topic, count)
		if d.Note != "" {
			fmt.Fprintf(r.stdout, " (%s)", d.Note)
		}
	}
	fmt.Fprintf(r.stdout, "\nreplay them with: ferry pipelines dead-letters %s --replay\n", r.name)
	return 0
}

func orDash(v any) any {
	if v == nil {
		return "-"
	}
	return v
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
