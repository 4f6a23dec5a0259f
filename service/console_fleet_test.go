package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/sources/xid8"
)

// fleetSize is how many idle pipelines TestConsoleFleetInBrowser runs:
// FERRY_FLEET_PIPELINES, else 200 (each holds a connection to the test
// cluster, which allows 300).
func fleetSize(t *testing.T) int {
	if s := os.Getenv("FERRY_FLEET_PIPELINES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("FERRY_FLEET_PIPELINES=%q: want a count", s)
		}
		return n
	}
	return 200
}

// The fleet view against a real `ferry run --store` running many idle
// pipelines and five whose broker is down (a NATS port nothing listens
// on): the failing ones come first by default, the counts filter, a
// search and a sort complete, the keyboard opens a pipeline, whose flow
// picture (source → headers → sink) marks the sink, a tenant token sees
// only its own rows, and a router that dead-letters is the stage marked.
func TestConsoleFleetInBrowser(t *testing.T) {
	tab := browser(t)
	n := fleetSize(t)
	in, env := startFleet(t, n)
	measureSummary(t, in, n+len(fleetBroken))
	ui := "http://" + in.addr + "/ui/"
	fleetPNG := checkFleetTable(t, tab, ui, n)
	pagePNG := checkKeysAndFlow(t, tab, ui)

	// A phone: nothing wider than the screen.
	inBrowser(t, tab, 30*time.Second, "phone", emulation.SetDeviceMetricsOverride(390, 844, 3, true), chromedp.Navigate(ui+"#"))
	waitJS(t, tab, 10*time.Second, "the phone's table", `document.querySelectorAll('#fleet-table tbody tr').length > 0 && document.documentElement.scrollWidth <= window.innerWidth`)
	var phonePNG []byte
	inBrowser(t, tab, 20*time.Second, "phone screenshot", chromedp.CaptureScreenshot(&phonePNG), emulation.ClearDeviceMetricsOverride())
	saveShots(t, map[string][]byte{"console-fleet.png": fleetPNG, "console-pipeline.png": pagePNG, "console-fleet-phone.png": phonePNG})

	// A tenant token sees its own rows only.
	var tok struct{ Token string }
	if code, body := in.api("POST", "/api/v1/tokens", `{"scope":"tenant:team-b"}`, &tok, "Content-Type", "application/json"); code != 201 {
		t.Fatalf("create token: %d %s", code, body)
	}
	inBrowser(t, tab, 30*time.Second, "sign out", chromedp.Click(`#logout`, chromedp.ByQuery), chromedp.WaitVisible(`#login`))
	inBrowser(t, tab, 30*time.Second, "sign in as team-b", chromedp.SendKeys(`#token`, tok.Token), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	// A loaded store may not answer the token check at once (the console
	// then says so and retries); it must never call the token unknown.
	// Should the rows not come, say what the API answers the token now and
	// what the page held: the sign-in form's error and the banner.
	defer func() {
		if !t.Failed() {
			return
		}
		code, body := apiAs(in, tok.Token, "GET", "/api/v1/summary")
		var loginErr, banner string
		_ = chromedp.Run(tab, chromedp.Evaluate(`document.querySelector('#login-error').textContent`, &loginErr),
			chromedp.Evaluate(`document.querySelector('#banner').textContent`, &banner))
		t.Logf("the team-b token now: %d %.300s; the sign-in error: %q; the banner: %q", code, body, loginErr, banner)
	}()
	waitJS(t, tab, time.Minute, "team-b's rows only", fmt.Sprintf(`document.querySelector('#counts span').textContent === (%d).toLocaleString('en-US') + ' pipelines' &&
		document.querySelector('#f-tenant').dataset.values === '\nteam-b' &&
		[...document.querySelectorAll('#fleet-table tbody tr')].every(tr => tr.querySelector('.c-tenant').textContent === 'team-b')`, n/len(fleetTenants)+1))

	checkDeadLetterFlow(t, tab, ui, in, env)
}

// checkDeadLetterFlow adds a pipeline whose router finds no route for its
// events (route_replace matches none) and dead-letters them: the flow
// picture marks the router, not the sink, and says how many.
func checkDeadLetterFlow(t *testing.T, tab context.Context, ui string, in *instance, f fleetEnv) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, f.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ddl, _ := xid8.Schema("outbox_dl_router")
	if _, err := pool.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("name: dl-router\ntenant: team-b\nsource: {type: xid8, dsn: %q, table: outbox_dl_router}\n"+
		"transforms: [{type: event_router, topic: '%s.routed.${route}', route_replace: {pattern: '^never-(\\w+)$'}}]\n"+
		"dead_letter: {topic: %s.dead}\nsink: {type: nats, url: %q, subject: %s.dl}\n", f.DSN, f.Subject, f.Subject, f.NATS, f.Subject)
	if code, body := in.api("PUT", "/api/v1/pipelines/dl-router/config", y, nil); code != 201 {
		t.Fatalf("create dl-router: %d %s", code, body)
	}
	testenv.Eventually(t, time.Minute, "dl-router running", func() bool {
		state, _ := in.localStatus("dl-router")
		return state == "running"
	})
	if _, err := pool.Exec(ctx, `INSERT INTO outbox_dl_router (aggregate_type, aggregate_id, type, payload)
		SELECT 'order', 'o-' || i, 'T', '{}' FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	inBrowser(t, tab, 30*time.Second, "open dl-router", chromedp.Navigate(ui+"#p=dl-router"))
	waitJS(t, tab, 60*time.Second, "the router marked as dead-lettering", `!document.querySelector('#page').hidden &&
		document.querySelector('#flow').dataset.unhealthy === '0:event_router' &&
		document.querySelector('#flow .stage-box.bad[data-stage="0:event_router"] .why').textContent === 'first unhealthy stage: dead-lettered 3 events' &&
		!document.querySelector('#flow .stage-box[data-stage="publish"]').classList.contains('bad') &&
		/p99\d/.test(document.querySelector('#flow .stage-box[data-stage="0:event_router"] dl').textContent) &&
		[...document.querySelectorAll('#flow .segment')].map(s => s.dataset.segment).join() === 'commit_to_read,ack_to_consumed,read_to_ack,commit_to_ack'`)
}

// The fleet's tenants, and its failing pipelines: named to sort last, so
// only the default order puts them first.
var (
	fleetTenants = []string{"team-a", "team-b", "team-c", "team-d", "team-e"}
	fleetBroken  = []string{"zz-broken-1", "zz-broken-2", "zz-broken-3", "zz-broken-4", "zz-broken-5"}
)

// startFleet starts an instance running n idle pipelines (source →
// headers → sink) and the fleetBroken ones, whose NATS is a port nothing
// listens on, each with an event to publish; it returns once every one is
// in its state (running, backing off).
func startFleet(t *testing.T, n int) (*instance, fleetEnv) {
	t.Helper()
	dsn := testenv.Postgres(t)
	nats, err := natsserver.Start(0, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nats.Close)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	subject := "ferry.fleet." + testenv.Name("f")
	testenv.CollectStream(t, nats.URL(), strings.ToUpper(testenv.Name("fleet")), 100*time.Millisecond, subject+".>")
	in := startStoreInstance(t, "fleet", testenv.Postgres(t), "--ui-sample-interval", "5s")
	const dead = "nats://127.0.0.1:1" // nothing listens there
	for _, tenant := range fleetTenants {
		body, _ := json.Marshal(map[string]any{"policy": map[string]any{"databases": []string{hostOf(t, dsn) + "/*"},
			"brokers": []string{hostOf(t, nats.URL()), "127.0.0.1:1"}, "destinations": []string{"ferry.fleet"}, "shared_databases": true}})
		if code, out := in.api("PUT", "/api/v1/tenants/"+tenant, string(body), nil, "Content-Type", "application/json"); code >= 300 {
			t.Fatalf("policy of %s: %d %s", tenant, code, out)
		}
	}
	// Each its own outbox: pipelines reading one table into one stream
	// would share the broker's deduplication.
	create := func(name, tenant, broker string) {
		table := "outbox_" + strings.ReplaceAll(name, "-", "_")
		ddl, _ := xid8.Schema(table)
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		y := fmt.Sprintf("name: %s\ntenant: %s\nsource: {type: xid8, dsn: %q, table: %s}\n"+
			"transforms: [{type: headers}]\nsink: {type: nats, url: %q, subject: %s.%s}\n", name, tenant, dsn, table, broker, subject, name)
		if code, body := in.api("PUT", "/api/v1/pipelines/"+name+"/config", y, nil); code != 201 {
			t.Fatalf("create %s: %d %s", name, code, body)
		}
	}
	start := time.Now()
	for i := range n {
		create(fmt.Sprintf("fleet-%04d", i), fleetTenants[i%len(fleetTenants)], nats.URL())
	}
	for i, name := range fleetBroken {
		create(name, fleetTenants[i%len(fleetTenants)], dead)
		// The sink connects lazily: the outage shows once it publishes.
		if _, err := pool.Exec(ctx, `INSERT INTO outbox_`+strings.ReplaceAll(name, "-", "_")+` (aggregate_type, aggregate_id, type, payload) VALUES ('order', 'o-1', 'T', '{}')`); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d pipelines created in %s", n+len(fleetBroken), time.Since(start).Round(time.Millisecond))
	waitFleet(t, in, n+len(fleetBroken))
	t.Logf("%d pipelines in their state %s after the first was created", n+len(fleetBroken), time.Since(start).Round(time.Millisecond))
	return in, fleetEnv{DSN: dsn, NATS: nats.URL(), Subject: subject}
}

// fleetEnv is where the fleet's pipelines read and publish.
type fleetEnv struct{ DSN, NATS, Subject string }

// waitFleet waits for the summary to list all pipelines, the broken ones
// backing off and the rest running.
func waitFleet(t *testing.T, in *instance, all int) {
	t.Helper()
	var sum struct{ Rows [][]any }
	defer func() {
		if t.Failed() {
			t.Logf("the last summary: %v", sum.Rows)
		}
	}()
	testenv.Eventually(t, 3*time.Minute, "every pipeline in its state", func() bool {
		if code, _ := in.api("GET", "/api/v1/summary", "", &sum); code != 200 || len(sum.Rows) != all {
			return false
		}
		for _, r := range sum.Rows {
			want := "running"
			if strings.HasPrefix(r[0].(string), "zz-") {
				want = "backing_off"
			}
			if r[2] != want {
				return false
			}
		}
		return true
	})
}

// checkFleetTable signs in as the admin and checks the table: the first
// render, the failing pipelines first, the counts, a count's filter, a
// search, a sort both ways, the view kept in the URL. It answers the
// first screen's picture.
func checkFleetTable(t *testing.T, tab context.Context, ui string, n int) []byte {
	t.Helper()
	inBrowser(t, tab, 20*time.Second, "open the console", chromedp.Navigate(ui), chromedp.WaitVisible(`#login`))
	inBrowser(t, tab, 30*time.Second, "sign in", chromedp.SendKeys(`#token`, cpAdmin), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 30*time.Second, "the table drawn", `document.querySelectorAll('#fleet-table tbody tr').length > 0`)

	// First render: a reload with the token in the tab's session.
	var renderMS float64
	inBrowser(t, tab, 30*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(`#fleet-table tbody tr`))
	waitJS(t, tab, 10*time.Second, "rendered", `document.body.dataset.rendered === 'true'`)
	inBrowser(t, tab, 30*time.Second, "render time", chromedp.Evaluate(`performance.getEntriesByName('ferry-rendered')[0].startTime`, &renderMS))
	var drawn int
	inBrowser(t, tab, 30*time.Second, "rows drawn", chromedp.Evaluate(`document.querySelectorAll('#fleet-table tbody tr').length`, &drawn))
	t.Logf("fleet view first render (navigation start → table drawn, %d pipelines, %d rows in the DOM): %.0f ms", n+len(fleetBroken), drawn, renderMS)
	if drawn > 50 {
		t.Errorf("%d rows in the DOM, want one page (≤ 50)", drawn)
	}
	// The failing ones are first, on the first screen, with their error.
	first := `[...document.querySelectorAll('#fleet-table tbody tr')].slice(0, 5)`
	waitJS(t, tab, 10*time.Second, "the five failing pipelines first", first+`.every(tr => tr.dataset.pipeline.startsWith('zz-broken-') &&
		tr.classList.contains('unhealthy') && tr.querySelector('.c-error').textContent.length > 0 &&
		tr.getBoundingClientRect().bottom <= window.innerHeight)`)
	waitJS(t, tab, 5*time.Second, "the counts", `document.querySelector('#counts button[data-state="backing_off"]').textContent === '5 backing off' &&
		document.querySelector('#counts button[data-state="running"]').textContent === (`+fmt.Sprint(n)+`).toLocaleString('en-US') + ' running'`)
	var fleetPNG []byte
	inBrowser(t, tab, 20*time.Second, "fleet screenshot", chromedp.CaptureScreenshot(&fleetPNG))

	// A count filters; a search and a sort complete; the URL holds it all.
	took := clickAndWait(t, tab, `#counts button[data-state="running"]`, "only running rows", `location.hash.includes('state=running') &&
		[...document.querySelectorAll('#fleet-table tbody tr')].every(tr => tr.classList.contains('s-running')) &&
		document.querySelector('#page-of').textContent.startsWith('1–`+fmt.Sprint(min(50, n))+` of ' + (`+fmt.Sprint(n)+`).toLocaleString('en-US') + ' ')`)
	t.Logf("state filter: click → drawn %s as the driver sees it; %s in the page", took, pageMS(t, tab))
	inBrowser(t, tab, 20*time.Second, "search", chromedp.SendKeys(`#q`, "fleet-001"))
	waitJS(t, tab, 10*time.Second, "the search's rows", `[...document.querySelectorAll('#fleet-table tbody tr')].map(tr => tr.dataset.pipeline).join() ===
		Array.from({length: 10}, (_, i) => 'fleet-001' + i).join() && location.hash.includes('q=fleet-001')`)
	took = clickAndWait(t, tab, `#fleet-table th[data-sort="name"]`, "sorted by name", `location.hash.includes('sort=name') &&
		document.querySelector('#fleet-table tbody tr').dataset.pipeline === 'fleet-0010'`)
	took += clickAndWait(t, tab, `#fleet-table th[data-sort="name"]`, "sorted by name, descending", `location.hash.includes('dir=desc') &&
		document.querySelector('#fleet-table tbody tr').dataset.pipeline === 'fleet-0019'`)
	t.Logf("two sorts: click → drawn %s as the driver sees it; the last %s in the page", took, pageMS(t, tab))
	// The view survives a reload: it is in the URL.
	inBrowser(t, tab, 30*time.Second, "reload the filtered view", chromedp.Reload(), chromedp.WaitVisible(`#fleet-table tbody tr`))
	waitJS(t, tab, 10*time.Second, "the same view after a reload", `document.querySelector('#fleet-table tbody tr').dataset.pipeline === 'fleet-0019' &&
		document.querySelector('#q').value === 'fleet-001' && document.querySelector('#f-state').value === 'running'`)
	return fleetPNG
}

// checkKeysAndFlow finds a failing pipeline with the keyboard (/ searches,
// j moves, Enter opens), checks its flow picture marks the sink, and goes
// back with Escape. It answers the pipeline page's picture.
func checkKeysAndFlow(t *testing.T, tab context.Context, ui string) []byte {
	t.Helper()
	inBrowser(t, tab, 30*time.Second, "back to the default view", chromedp.Navigate(ui+"#"), chromedp.WaitVisible(`#fleet-table tbody tr`))
	waitJS(t, tab, 10*time.Second, "the default view", `document.querySelector('#fleet-table tbody tr').dataset.pipeline.startsWith('zz-broken-')`)
	inBrowser(t, tab, 30*time.Second, "/", chromedp.KeyEvent("/"))
	waitJS(t, tab, 5*time.Second, "/ focusing the search", `document.activeElement === document.querySelector('#q')`)
	// CDP sends the key's character apart from its keydown, so the page's
	// preventDefault does not stop it as a browser would: clear it.
	inBrowser(t, tab, 30*time.Second, "type a name", chromedp.Evaluate(`document.querySelector('#q').value = ''`, nil), chromedp.KeyEvent("zz-broken-3"), chromedp.KeyEvent(kb.Escape))
	waitJS(t, tab, 10*time.Second, "one row found", `document.querySelectorAll('#fleet-table tbody tr').length === 1`)
	inBrowser(t, tab, 30*time.Second, "open with j and Enter", chromedp.KeyEvent("j"), chromedp.KeyEvent(kb.Enter))
	waitJS(t, tab, 20*time.Second, "the pipeline's page, its sink marked", `location.hash.includes('p=zz-broken-3') && !document.querySelector('#page').hidden &&
		!!document.querySelector('article.pipeline[data-pipeline="zz-broken-3"]') &&
		document.querySelector('#flow').dataset.unhealthy === 'publish' &&
		document.querySelector('#flow .stage-box.bad[data-stage="publish"] .why').textContent.includes('nats') &&
		[...document.querySelectorAll('#flow .stage-box')].map(b => b.dataset.stage + (b.classList.contains('bad') ? '!' : '')).join() === 'read,0:headers,publish!'`)
	// The same rule on what this fleet does not show: a transform that
	// dead-letters is marked, a source's error marks the source.
	waitJS(t, tab, 5*time.Second, "the first unhealthy stage's rule", `(() => {
		const names = ['read', '0:router', '1:headers', 'publish'];
		const dl = Ferry.firstUnhealthy({state: 'running', last_error: ''}, names, {'0:router': {ok: 5, dead_lettered: 3}});
		const src = Ferry.firstUnhealthy({state: 'backing_off', last_error: 'start source xid8: connect to the database: refused'}, names, {'0:router': {dead_lettered: 1}});
		const well = Ferry.firstUnhealthy({state: 'running', last_error: ''}, names, {'0:router': {ok: 5}});
		return dl.stage === '0:router' && dl.why === 'dead-lettered 3 events' && src.stage === 'read' && well === null;
	})()`)
	var pagePNG []byte
	inBrowser(t, tab, 20*time.Second, "pipeline screenshot", chromedp.CaptureScreenshot(&pagePNG))
	inBrowser(t, tab, 30*time.Second, "back with Escape", chromedp.KeyEvent(kb.Escape))
	waitJS(t, tab, 10*time.Second, "the search again", `!document.querySelector('#fleet').hidden && document.querySelector('#q').value === 'zz-broken-3'`)
	return pagePNG
}

// pageMS is what the fleet table's last draw took in the page: the
// driver's click-to-condition time adds its own round trips and polling.
func pageMS(t *testing.T, tab context.Context) time.Duration {
	t.Helper()
	var ms float64
	inBrowser(t, tab, 30*time.Second, "the last draw's time", chromedp.Evaluate(`Ferry.renderMS || 0`, &ms))
	return time.Duration(ms * float64(time.Millisecond)).Round(100 * time.Microsecond)
}

// clickAndWait clicks sel and waits for cond, answering how long it took.
func clickAndWait(t *testing.T, tab context.Context, sel, what, cond string) time.Duration {
	t.Helper()
	start := time.Now()
	inBrowser(t, tab, 30*time.Second, "click "+sel, chromedp.Click(sel, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, what, cond)
	return time.Since(start).Round(time.Millisecond)
}

// measureSummary logs what one refresh of the fleet view costs: the
// summary's bytes, plain and gzipped, and the server's time to answer.
func measureSummary(t *testing.T, in *instance, pipelines int) {
	t.Helper()
	get := func(path string, gzip bool) (int, time.Duration) {
		req, _ := http.NewRequest("GET", "http://"+in.addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+cpAdmin)
		tr := &http.Transport{DisableCompression: true}
		if gzip {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		start := time.Now()
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return len(b), time.Since(start)
	}
	const rounds = 10
	var plain, zipped int
	var total time.Duration
	for range rounds {
		p, d := get("/api/v1/summary", false)
		z, dz := get("/api/v1/summary", true)
		plain, zipped, total = p, z, total+d+dz
	}
	t.Logf("GET /api/v1/summary at %d pipelines: %d bytes (%d gzipped), %s per answer (mean of %d, on this loaded machine)",
		pipelines, plain, zipped, (total / (2 * rounds)).Round(10*time.Microsecond), 2*rounds)
	// What the cards' refresh asked for instead, for comparison (the list
	// alone; each card also read its history).
	list, took := get("/api/v1/pipelines", false)
	t.Logf("GET /api/v1/pipelines at %d pipelines: %d bytes, %s", pipelines, list, took.Round(10*time.Microsecond))
}

// saveShots writes the screenshots as test artifacts and, with
// FERRY_CONSOLE_SCREENSHOT_DIR (e.g. docs), there too.
func saveShots(t *testing.T, shots map[string][]byte) {
	t.Helper()
	dirs := []string{t.ArtifactDir()}
	if d := os.Getenv("FERRY_CONSOLE_SCREENSHOT_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for name, b := range shots {
		if len(b) < 10_000 {
			t.Errorf("screenshot %s is %d bytes: too small to hold the page", name, len(b))
		}
		for _, d := range dirs {
			if err := os.WriteFile(filepath.Join(d, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	i := strings.Index(raw, "://")
	rest := raw[i+3:]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}
