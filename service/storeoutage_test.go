package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/pgcluster"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The log lines a store outage gives, each once per change.
const (
	storeDownLine = `msg="control-plane store unreachable: pipelines keep running as last read`
	storeUpLine   = `msg="control-plane store reachable again"`
)

// storeProc is an instance on a store of its own, its log kept.
type storeProc struct {
	*instance
	log    *syncBuffer
	exited chan error
}

// startStoreProc runs an instance on storeDSN without waiting for it: the
// store may be down.
func startStoreProc(t *testing.T, name, storeDSN string, extra ...string) *storeProc {
	t.Helper()
	p := &storeProc{instance: &instance{name: name, addr: freeAddr(t)}, log: &syncBuffer{}, exited: make(chan error, 1)}
	args := append([]string{"--store", storeDSN, "--http", p.addr, "--instance-id", name, "--ha-interval", "500ms",
		"--store-interval", "1s", "--log-level", "info", "--shutdown-timeout", "3s"}, extra...)
	p.cmd = child(args, "FERRY_ADMIN_TOKEN="+cpAdmin)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.log.String())
		}
	})
	return p
}

// kill ends the instance at once (SIGKILL) and waits for it; safe to call
// twice.
func (p *storeProc) kill() {
	_ = p.cmd.Process.Kill()
	err := <-p.exited
	p.exited <- err
}

// alive fails the test if the instance exited.
func (p *storeProc) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("%s exited (%v):\n%s", p.name, err, p.log.String())
	default:
	}
}

// probe is one answer of an open probe: its status code and body.
func (p *storeProc) probe(path string) (int, string) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + p.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// storeState is GET /api/v1/pipelines's store object.
type storeState struct {
	Up        bool       `json:"up"`
	ReadAt    *time.Time `json:"read_at"`
	Since     *time.Time `json:"since"`
	LastError string     `json:"last_error"`
}

func (p *storeProc) store() (storeState, bool) {
	var body struct {
		Store *storeState `json:"store"`
	}
	if code, _ := p.api("GET", "/api/v1/pipelines", "", &body); code != 200 || body.Store == nil {
		return storeState{}, false
	}
	return *body.Store, true
}

// outageLoggedOnce checks that the store's outage was logged once down and
// once up. What the API shows comes first: the lines reach the test
// through the child's output pipe, maybe later (the loaded suite once
// checked before the "reachable again" line had arrived).
func (p *storeProc) outageLoggedOnce(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the store's return logged", func() bool {
		return strings.Contains(p.log.String(), storeUpLine)
	})
	logs := p.log.String()
	if n, m := strings.Count(logs, storeDownLine), strings.Count(logs, storeUpLine); n != 1 || m != 1 {
		t.Errorf("the outage was logged %d times down and %d times up; want once each", n, m)
	}
}

// watchReady samples /readyz until stop is closed; bad returns the
// answers that were not 200, and how many answers came (a request the
// loaded machine did not answer in time is no answer).
func (p *storeProc) watchReady(stop <-chan struct{}) (bad func() ([]string, int)) {
	var mu sync.Mutex
	var out []string
	answers := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			code, body := p.probe("/readyz")
			mu.Lock()
			if code != 0 {
				answers++
			}
			if code != 0 && code != http.StatusOK {
				out = append(out, fmt.Sprintf("%s: %d %s", time.Now().Format("15:04:05.000"), code, body))
			}
			mu.Unlock()
		}
	}()
	return func() ([]string, int) { <-done; mu.Lock(); defer mu.Unlock(); return out, answers }
}

// A tenant's pipeline whose database host does not exist, then a 10 s
// outage of the store: /readyz answers 200 throughout (sampled every
// 100 ms), while the broken pipeline shows in its count and details and
// the outage in the API (store.up false, since, last_error), on
// ferry_store_up and in one log line each way. A pipeline of another
// tenant delivers during the outage.
func TestReadyThroughBrokenPipelineAndStoreOutage(t *testing.T) {
	ctx := context.Background()
	storeDB, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { storeDB.Close() })
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	p := startStoreProc(t, "a", storeDB.DSN("postgres"))
	testenv.Eventually(t, 60*time.Second, "ready", func() bool { code, _ := p.probe("/readyz"); return code == 200 })

	const nowhere = "postgres://u@ferry-no-such-host.invalid:5432/db"
	p.allowTenant(t, "team-good", e.DSN, e.NATS, e.Subject)
	p.allowTenant(t, "team-broken", nowhere, e.NATS, e.Subject)
	good := fmt.Sprintf("name: good\ntenant: team-good\nsource: {type: xid8, dsn: %q, table: %s, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s}\n",
		e.DSN, e.Table, e.NATS, e.Subject)
	broken := fmt.Sprintf("name: broken\ntenant: team-broken\nsource: {type: xid8, dsn: %q, table: outbox, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.broken}\n",
		nowhere, e.NATS, e.Subject)
	for _, y := range []string{good, broken} {
		if code, body := p.api("POST", "/api/v1/pipelines", y, nil); code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
	}
	stop := make(chan struct{})
	notReady := p.watchReady(stop)
	testenv.Eventually(t, 60*time.Second, "the broken pipeline counted as not running, named to the admin", func() bool {
		_, body := p.api("GET", "/readyz", "", nil)
		return strings.Contains(body, `"not_running": 1`) && strings.Contains(body, `"pipelines.broken"`)
	})
	testenv.Eventually(t, 60*time.Second, "the good pipeline running", func() bool { st, _ := p.localStatus("good"); return st == "running" })
	if code, body := p.probe("/readyz"); strings.Contains(body, "broken") || strings.Contains(body, "invalid") || code != 200 {
		t.Errorf("open /readyz: %d %s; want 200 naming no pipeline", code, body)
	}

	if err := storeDB.Stop(); err != nil {
		t.Fatal(err)
	}
	outageEnds := time.Now().Add(10 * time.Second)
	testenv.Eventually(t, 30*time.Second, "the API reporting the store down, with since and the error", func() bool {
		s, ok := p.store()
		return ok && !s.Up && s.Since != nil && s.LastError != "" && s.ReadAt != nil
	})
	testenv.Eventually(t, 60*time.Second, "ferry_store_up 0", func() bool {
		_, m := p.probe("/metrics")
		return strings.Contains(m, "\nferry_store_up 0\n")
	})
	if _, body := p.api("GET", "/readyz", "", nil); !strings.Contains(body, `"path": "store"`) {
		t.Errorf("the admin's /readyz does not list the store: %s", body)
	}
	// A token the instance cannot check (made since the store's last read,
	// for all it knows) is not called unknown: the store did not answer.
	// The API's routes and /readyz, which details its answer for a token.
	for _, path := range []string{"/api/v1/pipelines", "/readyz"} {
		req, _ := http.NewRequest("GET", "http://"+p.addr+path, nil)
		req.Header.Set("Authorization", "Bearer ferry_made_during_the_outage")
		if resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req); err != nil {
			t.Errorf("%s with a token during the outage: %v", path, err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || !strings.Contains(string(b), "cannot be checked now") {
				t.Errorf("%s with a token the instance cannot check during the outage: %d %s; want 503 saying so", path, resp.StatusCode, b)
			}
		}
	}
	w, err := plugintest.Insert(ctx, e.Pool, "during-outage")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 30*time.Second, "an event delivered during the store outage", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Header.Get("outbox_id") == fmt.Sprint(w.OutboxID) {
				return true
			}
		}
		return false
	})
	// The outage lasts 10 s whatever the checks above took; /readyz is
	// sampled all along.
	testenv.Eventually(t, 30*time.Second, "10 s of store outage", func() bool { return time.Now().After(outageEnds) })
	if err := storeDB.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the API reporting the store up again", func() bool {
		s, ok := p.store()
		return ok && s.Up && s.Since == nil && s.LastError == ""
	})
	close(stop)
	bad, answers := notReady()
	if len(bad) > 0 {
		t.Errorf("/readyz was not 200 %d times of %d, first: %s", len(bad), answers, bad[0])
	}
	if answers < 50 { // the outage alone lasts 10 s: some 100 samples
		t.Errorf("/readyz answered %d times; too few samples to say it stayed ready", answers)
	}
	p.outageLoggedOnce(t)
	p.alive(t)
}

// An instance started while its store is down comes up: /healthz answers,
// its file pipeline delivers, it reports the outage (API store object,
// /readyz 503 saying it waits for the store's first read) and logs it
// once; when the store returns it runs the store's pipeline, and /readyz
// turns 200.
func TestStartsWithoutTheStore(t *testing.T) {
	ctx := context.Background()
	storeDB, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { storeDB.Close() })
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	storedColl := testenv.CollectStream(t, e.NATS, e.Stream+"_S", 100*time.Millisecond, e.Subject+".stored")
	// The store holds a pipeline (an admin's) before the outage.
	first := startStoreProc(t, "first", storeDB.DSN("postgres"))
	testenv.Eventually(t, 60*time.Second, "the first instance answering", func() bool {
		code, _ := first.api("GET", "/api/v1/pipelines", "", nil)
		return code == 200
	})
	ddl, _ := xid8.Schema("outbox_stored")
	if _, err := e.Pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	stored := fmt.Sprintf("name: stored\nsource: {type: xid8, dsn: %q, table: outbox_stored, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.stored}\n",
		e.DSN, e.NATS, e.Subject)
	if code, body := first.api("POST", "/api/v1/pipelines", stored, nil); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	first.kill()
	if err := storeDB.Stop(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file.yaml"), []byte(e.YAML("file", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startStoreProc(t, "b", storeDB.DSN("postgres"), "-c", dir)
	testenv.Eventually(t, 60*time.Second, "/healthz 200 with the store down", func() bool { code, _ := p.probe("/healthz"); return code == 200 })
	testenv.Eventually(t, 30*time.Second, "the API reporting the store down, never read", func() bool {
		s, ok := p.store()
		return ok && !s.Up && s.Since != nil && s.LastError != "" && s.ReadAt == nil
	})
	code, body := p.probe("/readyz")
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	_ = json.Unmarshal([]byte(body), &ready)
	if code != 503 || ready.Checks["router"] != "ok" || !strings.Contains(ready.Checks["configuration"], "store") {
		t.Errorf("/readyz before the store's first read: %d %s; want 503 waiting for the store", code, body)
	}
	w, err := plugintest.Insert(ctx, e.Pool, "file-pipeline")
	if err != nil {
		t.Fatal(err)
	}
	e.Coll.WaitFor(t, 60*time.Second, "the file pipeline delivering with the store down", func(m []testenv.Received) bool {
		for _, r := range m {
			if r.Header.Get("outbox_id") == fmt.Sprint(w.OutboxID) {
				return true
			}
		}
		return false
	})
	// Retries go on (backoff up to --store-interval 1s); the log says it once.
	testenv.Eventually(t, 30*time.Second, "a few retries", func() bool {
		s, _ := p.store()
		return s.Since != nil && time.Since(*s.Since) > 3*time.Second
	})
	p.alive(t)

	if err := storeDB.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the store's pipeline running once the store is back", func() bool {
		st, _ := p.localStatus("stored")
		return st == "running"
	})
	if _, err := e.Pool.Exec(ctx, `INSERT INTO outbox_stored (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'back', 'T', '{}')`); err != nil {
		t.Fatal(err)
	}
	storedColl.WaitFor(t, 60*time.Second, "the store's pipeline delivering", func(m []testenv.Received) bool { return len(m) > 0 })
	testenv.Eventually(t, 30*time.Second, "ready once the store was read", func() bool { code, _ := p.probe("/readyz"); return code == 200 })
	p.outageLoggedOnce(t)
	p.alive(t)
}
