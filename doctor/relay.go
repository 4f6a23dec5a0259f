package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/ownership"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/plugins"
)

// checkRelay asks a running Ferry about the pipeline, or, without one,
// looks for the relay's session on the source database. A relay that runs
// but reports trouble (backing_off, stalled) is not judged here: the stages
// after it may explain why; suspect is the action if none does.
func checkRelay(ctx context.Context, spec *pipelines.Spec, o Options) (c Check, suspect string) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if o.URL != "" || o.Local != nil {
		return relayFromAPI(spec, o)
	}
	src, ok := spec.Source.Config.(plugins.OutboxSource)
	if !ok {
		return Check{Stage: StageRelay, Status: Unknown, Evidence: []string{"no --url, and the source has no database to look at"}}, ""
	}
	return relayFromSessions(ctx, spec, src.OutboxTable().DSN), ""
}

// relayFromAPI judges the relay by the pipeline's state as the running
// Ferry at o.URL, or the one the doctor runs inside (o.Local), reports it.
func relayFromAPI(spec *pipelines.Spec, o Options) (c Check, suspect string) {
	c = Check{Stage: StageRelay}
	st, err := o.status(spec.Name)
	if err != nil {
		from := o.URL
		if o.Local != nil {
			from = "this instance"
		}
		c.Status, c.Evidence = Unhealthy, []string{"cannot read the pipeline from " + from + ": " + err.Error()}
		c.Action = "is `ferry run` up, with --http, and does it run this pipeline?"
		return c, ""
	}
	times := "times"
	if st.Starts == 1 {
		times = "time"
	}
	c.Evidence = append(c.Evidence, fmt.Sprintf("state %s since %s, started %d %s", st.State, st.Since.Format(time.RFC3339), st.Starts, times))
	if st.Owner != "" && st.State != engine.StateStandby {
		c.Evidence = append(c.Evidence, "runs on instance "+st.Owner)
	}
	if st.LastError != "" {
		c.Evidence = append(c.Evidence, "last error: "+st.LastError)
	}
	if d := st.Duplicates; d != nil && *d > 0 {
		// Confirmed, so nothing is lost to the relay; but these events did
		// not arrive again where the pipeline sent them.
		c.Evidence = append(c.Evidence, fmt.Sprintf("publishes since start confirmed by the broker as duplicates, not stored (duplicates_total): %d; "+
			"another pipeline publishes the same event ids into the stream, or events were sent again within its duplicate window", *d))
	}
	switch st.State {
	case engine.StateRunning:
		c.Status = OK
	case engine.StateStalled:
		c.Status = OK
		suspect = "canaries stopped arriving, yet the source, the broker and the consumers look fine: read the relay's logs around the last error"
	case engine.StateBackingOff:
		c.Status = OK
		suspect = "the relay keeps failing: fix its last error — it retries on its own"
	case engine.StatePaused:
		c.Status, c.Action = Unhealthy, "the pipeline is paused: POST /api/v1/pipelines/"+spec.Name+"/resume"
	case engine.StateStandby:
		c.Status = OK
		c.Evidence = append(c.Evidence, "instance "+st.Owner+" runs it; this one takes over if it goes away")
	default:
		c.Status, c.Action = Unhealthy, "the relay is not running the pipeline: fix the last error and restart it"
	}
	return c, suspect
}

// sessions are the server sessions of one application name.
type sessions struct {
	n       int
	since   *time.Time // the first one's start
	clients []string   // their client addresses, "local" for a socket
}

// sessionsNamed reads the sessions named name, anywhere on the server or
// only on conn's database.
func sessionsNamed(ctx context.Context, conn *pgx.Conn, name string, thisDatabase bool) (s sessions, err error) {
	err = conn.QueryRow(ctx, `SELECT count(*), min(backend_start), COALESCE(array_agg(DISTINCT COALESCE(host(client_addr), 'local')) FILTER (WHERE pid IS NOT NULL), '{}')
		FROM pg_stat_activity WHERE application_name = $1 AND (NOT $2 OR datname = current_database())`, name, thisDatabase).Scan(&s.n, &s.since, &s.clients)
	return s, err
}

// sharedSessions reads the sessions on conn's database that serve many
// pipelines: a Ferry instance's pool (ferry:pool, its xid8 and poll
// pipelines) and its shared wal streams (ferry:shared:<slot>, the wal
// pipelines with slot_mode: shared).
func sharedSessions(ctx context.Context, conn *pgx.Conn) (s sessions, err error) {
	err = conn.QueryRow(ctx, `SELECT count(*), min(backend_start), COALESCE(array_agg(DISTINCT COALESCE(host(client_addr), 'local')) FILTER (WHERE pid IS NOT NULL), '{}')
		FROM pg_stat_activity WHERE (application_name = 'ferry:pool' OR application_name LIKE 'ferry:shared:%') AND datname = current_database()`).
		Scan(&s.n, &s.since, &s.clients)
	return s, err
}

// relayFromSessions judges the relay, without a running Ferry to ask, by
// the sessions on the source database at dsn.
func relayFromSessions(ctx context.Context, spec *pipelines.Spec, dsn string) Check {
	c := Check{Stage: StageRelay}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		c.Status, c.Evidence = Unknown, []string{"cannot connect to the source database: " + redact.String(err.Error())}
		return c
	}
	defer conn.Close(context.Background())
	// A pipeline's own sessions anywhere on the server; the shared pool's on
	// this database (it serves every xid8 and poll pipeline there).
	own, err := sessionsNamed(ctx, conn, "ferry:"+spec.Name, false)
	var shared sessions
	if err == nil && own.n == 0 {
		// xid8 and poll pipelines read through their database's shared
		// pool, shared wal pipelines through their shared stream.
		shared, err = sharedSessions(ctx, conn)
	}
	if err != nil {
		c.Status, c.Evidence = Unknown, []string{"cannot read pg_stat_activity: " + err.Error()}
		return c
	}
	if own.n == 0 {
		return relayWithoutSession(ctx, c, spec, dsn, shared)
	}
	c.Status = OK
	c.Evidence = append(c.Evidence, fmt.Sprintf("%d session(s) of ferry:%s connected since %s from %s", own.n, spec.Name, own.since.Format(time.RFC3339), strings.Join(own.clients, ", ")))
	return c
}

// relayWithoutSession judges a pipeline with no session of its own: an
// instance that owns it and reads through the shared pool, one that owns
// it and reads nothing, a pool that may be running it, or no instance.
func relayWithoutSession(ctx context.Context, c Check, spec *pipelines.Spec, dsn string, shared sessions) Check {
	c.Status = Unhealthy
	if holder, held, err := ownership.Holder(ctx, dsn, ownership.LockKey(spec.Name)); err == nil && held && shared.n > 0 {
		// Owned, and its instance reads the database through the
		// shared pool: whether this pipeline reads, only it can say.
		c.Status = OK
		c.Evidence = append(c.Evidence, fmt.Sprintf("instance %s owns %s (its lock session is connected) and reads this database through its shared sessions (%d of ferry:pool or ferry:shared:<slot>)", holder, spec.Name, shared.n))
		return c
	} else if err == nil && held {
		// Owned, yet nothing reads: paused, or its start keeps failing.
		c.Evidence = append(c.Evidence, fmt.Sprintf("instance %s owns %s (its lock session is connected) but no session named ferry:%s reads the source: the pipeline is paused, or cannot start", holder, spec.Name, spec.Name))
		c.Action = "ask that instance: ferry doctor --url <its --http address> (or ferry lag); resume it if paused"
		return c
	}
	if shared.n > 0 {
		c.Status = OK
		c.Evidence = append(c.Evidence, fmt.Sprintf("%d session(s) a Ferry instance shares among its pipelines on this database (ferry:pool for xid8 and poll, ferry:shared:<slot> for shared wal) connected since %s from %s; whether it runs %s: ferry doctor --url <its --http address>",
			shared.n, shared.since.Format(time.RFC3339), strings.Join(shared.clients, ", "), spec.Name))
		return c
	}
	c.Evidence = append(c.Evidence, fmt.Sprintf("no session named ferry:%s, ferry:pool or ferry:shared:<slot> on the source database: no Ferry instance is running this pipeline", spec.Name))
	c.Action = "start it: ferry run -c <the file defining " + spec.Name + ">"
	return c
}
