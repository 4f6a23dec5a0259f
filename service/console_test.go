package service_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/internal/natsserver"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/xid8"
)

// chromiumPath finds a Chromium or Chrome binary ("" when there is none).
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts a headless Chromium and returns a context for one tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("no chromium binary on PATH (install Debian's chromium package, or set CHROMIUM): the console's browser test cannot run")
	}
	// A fresh profile, removed once the browser is gone (its helper
	// processes may still write to it while it exits, so not t.TempDir).
	profile, err := os.MkdirTemp("", "ferry-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1280, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc(); os.RemoveAll(profile) })
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return ctx
}

// inBrowser runs browser actions with a deadline.
func inBrowser(t *testing.T, ctx context.Context, timeout time.Duration, what string, actions ...chromedp.Action) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chromedp.Run(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitJS polls a JavaScript condition in the page until it is true.
func waitJS(t *testing.T, ctx context.Context, timeout time.Duration, what, js string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		var ok bool
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := chromedp.Run(c, chromedp.Evaluate(js, &ok))
		cancel()
		if err == nil && ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			var body string
			_ = chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector('main').innerText`, &body))
			t.Fatalf("after %s: not %s; the page shows:\n%s", timeout, what, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// openPipeline opens a pipeline's page from the URL, as a row's link does,
// and waits for its card.
func openPipeline(t *testing.T, tab context.Context, ui, name string) {
	t.Helper()
	inBrowser(t, tab, 30*time.Second, "open "+name, chromedp.Navigate(ui+"#p="+name))
	waitJS(t, tab, 15*time.Second, name+"'s page", fmt.Sprintf(`!document.querySelector('#page').hidden && !!document.querySelector('article.pipeline[data-pipeline=%q]')`, name))
}

// fleetRows lists the fleet table's rows as "name@tenant".
const fleetRows = `[...document.querySelectorAll('#fleet-table tbody tr')].map(tr => tr.dataset.pipeline + '@' + tr.querySelector('.c-tenant').textContent).sort().join()`

func cardState(name string) string {
	return fmt.Sprintf(`(document.querySelector('article[data-pipeline=%q] .state')||{}).textContent`, name)
}

// The console against a real `ferry run --store` with PostgreSQL and NATS,
// in headless Chromium: it asks for a token, lists every pipeline in the
// fleet table, pauses one from its page's button, resets its offsets (dry run first),
// lists a poll pipeline's dead letters and replays them, draws the lag
// charts, shows a broker outage as backing off with the error, and a tenant
// token sees only its tenant.
func TestConsoleInBrowser(t *testing.T) {
	tab := browser(t)
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
	subject := "ferry.console." + testenv.Name("c")
	testenv.CollectStream(t, nats.URL(), strings.ToUpper(testenv.Name("console")), 100*time.Millisecond, subject+".>")
	pipes := map[string]string{"orders": "team-a", "invoices": "team-a", "billing": "team-b"}
	for name := range pipes {
		ddl, _ := xid8.Schema("outbox_" + name)
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	in := startStoreInstance(t, "console", testenv.Postgres(t), "--ui-sample-interval", "1s")
	for _, tenant := range []string{"team-a", "team-b", "team-c"} {
		in.allowTenant(t, tenant, dsn, nats.URL(), "ferry.console")
	}
	for name, tenant := range pipes {
		y := fmt.Sprintf("name: %s\ntenant: %s\nsource: {type: xid8, dsn: %q, table: outbox_%s, poll_interval: 20ms}\nsink: {type: nats, url: %q, subject: %s.%s}\n",
			name, tenant, dsn, name, nats.URL(), subject, name)
		if code, body := in.api("PUT", "/api/v1/pipelines/"+name+"/config", y, nil); code != 201 {
			t.Fatalf("create %s: %d %s", name, code, body)
		}
	}
	// A poll pipeline whose stream refuses messages over 512 bytes: with
	// max_attempts 1 its three big events are parked as dead letters.
	dlSubject := "ferry.consoledl." + testenv.Name("c")
	dlStream := strings.ToUpper(testenv.Name("consoledl"))
	dlColl := testenv.CollectStream(t, nats.URL(), dlStream, 0, dlSubject)
	setMaxMsgSize := func(n int32) {
		t.Helper()
		nc, err := natsgo.Connect(nats.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		st, err := js.Stream(c, dlStream)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		cfg.MaxMsgSize = n
		if _, err := js.UpdateStream(c, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setMaxMsgSize(512)
	pollDDL, _ := poll.Schema("outbox_refunds")
	if _, err := pool.Exec(ctx, pollDDL); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf("name: refunds\ntenant: team-c\nsource: {type: poll, dsn: %q, table: outbox_refunds, poll_interval: 20ms, max_attempts: 1}\nsink: {type: nats, url: %q, subject: %s}\n",
		dsn, nats.URL(), dlSubject)
	if code, body := in.api("PUT", "/api/v1/pipelines/refunds/config", y, nil); code != 201 {
		t.Fatalf("create refunds: %d %s", code, body)
	}
	var big []string
	for i := range 4 {
		pad := 2000
		if i == 0 {
			pad = 0
		}
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO outbox_refunds (aggregate_type, aggregate_id, type, payload)
			VALUES ('refund', $1, 'T', jsonb_build_object('pad', repeat('x', $2))) RETURNING id`, fmt.Sprintf("r%d", i), pad).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if pad > 0 {
			big = append(big, fmt.Sprint(id))
		}
	}
	var tok struct{ Token string }
	if code, body := in.api("POST", "/api/v1/tokens", `{"scope":"tenant:team-b"}`, &tok, "Content-Type", "application/json"); code != 201 {
		t.Fatalf("create token: %d %s", code, body)
	}
	// Traffic into every outbox, so the charts have lag to draw.
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for name := range pipes {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-time.After(25 * time.Millisecond):
				}
				if _, err := pool.Exec(ctx, `INSERT INTO outbox_`+name+` (aggregate_type, aggregate_id, type, payload) VALUES ('order', $1, 'T', '{}')`, fmt.Sprintf("agg-%d", k%5)); err != nil {
					return
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); writers.Wait() })
	testenv.Eventually(t, 30*time.Second, "every pipeline running", func() bool {
		for name := range pipes {
			if st, _ := in.localStatus(name); st != "running" {
				return false
			}
		}
		return true
	})

	// Without a token the page shows the login form and no pipeline.
	ui := "http://" + in.addr + "/ui/"
	inBrowser(t, tab, 20*time.Second, "open the console", chromedp.Navigate(ui), chromedp.WaitVisible(`#login`))
	var cards int
	inBrowser(t, tab, 30*time.Second, "count cards", chromedp.Evaluate(`document.querySelectorAll('article.pipeline').length`, &cards))
	if cards != 0 {
		t.Fatalf("%d pipelines visible without a token", cards)
	}
	// A wrong token is refused on the form.
	inBrowser(t, tab, 30*time.Second, "sign in with a wrong token", chromedp.SendKeys(`#token`, "not-a-token"), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "refusing the wrong token", `document.querySelector('#login-error').textContent.length > 0 && !document.querySelector('#login').hidden`)
	inBrowser(t, tab, 30*time.Second, "sign in", chromedp.SendKeys(`#token`, cpAdmin), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "listing the pipelines with their tenants", fleetRows+` === 'billing@team-b,invoices@team-a,orders@team-a,refunds@team-c'`)
	openPipeline(t, tab, ui, "billing")
	waitJS(t, tab, 15*time.Second, "billing running on the instance", cardState("billing")+` === 'running' &&
		document.querySelector('article[data-pipeline="billing"] .owner').textContent === 'console'`)

	// Render time: a reload with the token already in the tab's session.
	var renderMS float64
	inBrowser(t, tab, 20*time.Second, "reload", chromedp.Navigate(ui+"#"), chromedp.Reload(), chromedp.WaitVisible(`#fleet-table tr[data-pipeline="billing"]`))
	waitJS(t, tab, 10*time.Second, "rendered", `document.body.dataset.rendered === 'true'`)
	inBrowser(t, tab, 30*time.Second, "render time", chromedp.Evaluate(`performance.getEntriesByName('ferry-rendered')[0].startTime`, &renderMS))
	t.Logf("console render time (navigation start → pipelines drawn, %d pipelines): %.0f ms", len(pipes)+1, renderMS)

	// Pause from the button.
	openPipeline(t, tab, ui, "orders")
	inBrowser(t, tab, 30*time.Second, "click pause", chromedp.Click(`article[data-pipeline="orders"] button[data-action="pause"]`))
	waitJS(t, tab, 15*time.Second, "orders paused", cardState("orders")+` === 'paused'`)
	testenv.Eventually(t, 60*time.Second, "orders paused in the API", func() bool {
		st, _ := in.localStatus("orders")
		return st == "paused"
	})

	// Offsets of the paused pipeline: its position as the API gives it, a
	// reset to latest run dry first (its counts shown), then applied; the
	// same on a running pipeline is refused inline (409).
	ord := `article[data-pipeline="orders"] `
	// The writers keep adding rows, so something waits once it stopped.
	testenv.Eventually(t, 60*time.Second, "orders' rows waiting past its cursor", func() bool {
		var off struct {
			Position struct {
				Undelivered int64 `json:"undelivered_events"`
			} `json:"position"`
		}
		code, _ := in.api("GET", "/api/v1/pipelines/orders/offsets", "", &off)
		return code == 200 && off.Position.Undelivered > 0
	})
	inBrowser(t, tab, 30*time.Second, "open orders' offsets", chromedp.Click(ord+`button[data-action="offsets"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "orders' xid8 position shown", `['id', 'xact_id', 'undelivered_events'].every(k => [...document.querySelectorAll('`+ord+`.position dt')].some(d => d.textContent === k))`)
	inBrowser(t, tab, 30*time.Second, "dry-run a reset to latest", chromedp.Click(ord+`.reset button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "the dry run's counts", `/^dry run: [\d,]+ re-sent, [1-9][\d,]* skipped\./.test(document.querySelector('`+ord+`.reset-result').textContent) &&
		!document.querySelector('`+ord+`button[data-action="reset-apply"]').hidden`)
	var dry string
	inBrowser(t, tab, 30*time.Second, "dry run text", chromedp.Text(ord+`.reset-result`, &dry, chromedp.ByQuery))
	t.Logf("orders, paused, reset to latest: %q", dry)
	inBrowser(t, tab, 30*time.Second, "apply the reset", chromedp.Click(ord+`button[data-action="reset-apply"]`, chromedp.ByQuery))
	waitJS(t, tab, 30*time.Second, "the reset applied", `/^reset: [\d,]+ re-sent, [1-9][\d,]* skipped\./.test(document.querySelector('`+ord+`.reset-result').textContent)`)
	if code, body := in.api("GET", "/api/v1/audit?pipeline=orders", "", nil); code != 200 || !strings.Contains(body, `"offsets_reset"`) {
		t.Errorf("the reset from the page is not in the audit log: %d %s", code, body)
	}
	invo := `article[data-pipeline="invoices"] `
	openPipeline(t, tab, ui, "invoices")
	// A bad time is the API's 422, shown inline.
	inBrowser(t, tab, 30*time.Second, "open invoices' offsets", chromedp.Click(invo+`button[data-action="offsets"]`, chromedp.ByQuery),
		chromedp.SetValue(invo+`.reset select`, "time", chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('`+invo+`.reset select').dispatchEvent(new Event('change')) || true`, nil),
		chromedp.SendKeys(invo+`.reset input[name=time]`, "yesterday", chromedp.ByQuery),
		chromedp.Click(invo+`.reset button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "the bad time refused inline", `(() => { const r = document.querySelector('`+invo+`.reset-result');
		return r.classList.contains('error') && r.textContent.includes('"yesterday" is not an RFC 3339 time'); })()`)
	inBrowser(t, tab, 30*time.Second, "dry-run invoices to latest",
		chromedp.SetValue(invo+`.reset select`, "latest", chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('`+invo+`.reset select').dispatchEvent(new Event('change')) || true`, nil),
		chromedp.Click(invo+`.reset button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "invoices' dry run", `!document.querySelector('`+invo+`button[data-action="reset-apply"]').hidden`)
	inBrowser(t, tab, 30*time.Second, "apply on a running pipeline", chromedp.Click(invo+`button[data-action="reset-apply"]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "the 409 shown inline", `(() => { const r = document.querySelector('`+invo+`.reset-result');
		return r.classList.contains('error') && r.textContent.includes('pause it first'); })()`)

	// Dead letters: an xid8 source parks none, which the list says; Replay
	// shows the API's refusal inline.
	openPipeline(t, tab, ui, "orders")
	inBrowser(t, tab, 30*time.Second, "open orders' dead letters", chromedp.Click(ord+`button[data-action="deadletters"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "no dead letters for xid8", `document.querySelector('`+ord+`.dl-summary').textContent.includes('parks no events') && document.querySelector('`+ord+`.dl-list').hidden`)
	inBrowser(t, tab, 30*time.Second, "replay", chromedp.Click(ord+`button[data-action="replay"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the replay refused inline", `(() => { const r = document.querySelector('`+ord+`.replay-result');
		return r.classList.contains('error') && r.textContent.includes('parks no events to replay'); })()`)

	// Poll's parked events listed with id, reason and attempts; once the
	// stream takes them, Replay delivers them.
	ref := `article[data-pipeline="refunds"] `
	testenv.Eventually(t, 30*time.Second, "refunds' 3 dead letters", func() bool {
		var dl struct{ Total int }
		code, _ := in.api("GET", "/api/v1/pipelines/refunds/dead-letters", "", &dl)
		return code == 200 && dl.Total == 3
	})
	openPipeline(t, tab, ui, "refunds")
	inBrowser(t, tab, 30*time.Second, "open refunds' dead letters", chromedp.Click(ref+`button[data-action="deadletters"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the 3 dead letters listed", `(() => {
		const rows = [...document.querySelectorAll('`+ref+`.dl-list tbody tr')].map(tr => [...tr.children].map(td => td.textContent));
		return document.querySelector('`+ref+`.dl-summary').textContent === '3 parked' &&
			rows.map(r => r[0]).join() === '`+strings.Join(big, ",")+`' &&
			rows.every(r => r[1].includes('maximum') && r[2] === '1');
	})()`)
	setMaxMsgSize(-1)
	inBrowser(t, tab, 30*time.Second, "replay", chromedp.Click(ref+`button[data-action="replay"]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "3 replayed, none left", `document.querySelector('`+ref+`.replay-result').textContent === '3 replayed' &&
		document.querySelector('`+ref+`.dl-summary').textContent === '0 parked'`)
	dlColl.WaitFor(t, 30*time.Second, "the small event and the 3 replayed", func(m []testenv.Received) bool { return len(m) >= 4 })
	// Done with it: one pipeline fewer for the outage below.
	if code, body := in.api("DELETE", "/api/v1/pipelines/refunds", "", nil); code >= 300 {
		t.Fatalf("delete refunds: %d %s", code, body)
	}

	// Edit config: a bad key is reported inline by Validate and by Apply,
	// nothing changes; a good edit is applied as the next version.
	inv := `article[data-pipeline="invoices"] `
	openPipeline(t, tab, ui, "invoices")
	inBrowser(t, tab, 30*time.Second, "edit invoices", chromedp.Click(inv+`button[data-action="edit"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the editor holding invoices' config", `document.querySelector('`+inv+`textarea').value.includes('outbox_invoices')`)
	setConfig := func(js string) {
		inBrowser(t, tab, 30*time.Second, "edit the text", chromedp.Evaluate(`(() => { const a = document.querySelector('`+inv+`textarea'); a.value = `+js+`; return true; })()`, nil))
	}
	setConfig(`a.value + 'bogus_key: 1\n'`)
	inBrowser(t, tab, 30*time.Second, "validate", chromedp.Click(inv+`button[data-action="validate"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the validation error inline", `document.querySelector('`+inv+`.problems').textContent.includes('bogus_key')`)
	inBrowser(t, tab, 30*time.Second, "apply the bad config", chromedp.Click(inv+`.editor button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the apply refused inline", `document.querySelector('`+inv+`.problems').textContent.includes('nothing was changed')`)
	setConfig(`a.value.replace('bogus_key: 1\n', '').replace('poll_interval: 20ms', 'poll_interval: 30ms')`)
	inBrowser(t, tab, 30*time.Second, "apply the good config", chromedp.Click(inv+`.editor button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the edit applied", `document.querySelector('`+inv+`.action-result').textContent === 'applied: version 2' && document.querySelector('`+inv+`.editor').hidden`)
	var cfg struct{ Config string }
	if code, body := in.api("GET", "/api/v1/pipelines/invoices/config", "", &cfg, "Accept", "application/json"); code != 200 || !strings.Contains(cfg.Config, "poll_interval: 30ms") {
		t.Errorf("invoices' stored config after the edit: %d %s", code, body)
	}

	// Charts: several samples drawn (paths with segments) and stage counts.
	openPipeline(t, tab, ui, "billing")
	waitJS(t, tab, 60*time.Second, "billing's charts drawn", `(() => {
		const c = document.querySelector('article[data-pipeline="billing"] .chart[data-segment="commit_to_ack"] path.p50');
		return c && (c.getAttribute('d').match(/L/g) || []).length >= 15 &&
			document.querySelectorAll('article[data-pipeline="billing"] .stages tbody tr').length >= 2;
	})()`)
	var full, chart []byte
	inBrowser(t, tab, 20*time.Second, "screenshots",
		chromedp.FullScreenshot(&full, 100),
		chromedp.Screenshot(`article[data-pipeline="billing"] .chart[data-segment="commit_to_ack"] svg`, &chart, chromedp.ByQuery))
	art := t.ArtifactDir()
	for name, b := range map[string][]byte{"console.png": full, "chart.png": chart} {
		if err := os.WriteFile(filepath.Join(art, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out := os.Getenv("FERRY_CONSOLE_SCREENSHOT"); out != "" {
		if err := os.WriteFile(out, full, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(full) < 20_000 {
		t.Errorf("the page's screenshot is %d bytes: too small to hold the page", len(full))
	}
	img, err := png.Decode(bytes.NewReader(chart))
	if err != nil {
		t.Fatal(err)
	}
	if n, total := inked(img); n*50 < total {
		t.Errorf("the chart has %d of %d pixels off the background: empty", n, total)
	} else {
		t.Logf("screenshot %d bytes in %s; chart %dx%d with %d of %d pixels drawn", len(full), art, img.Bounds().Dx(), img.Bounds().Dy(), n, total)
	}

	// A phone: one column, nothing wider than the screen.
	inBrowser(t, tab, 30*time.Second, "phone viewport", emulation.SetDeviceMetricsOverride(390, 844, 3, true))
	var overflow bool
	inBrowser(t, tab, 30*time.Second, "overflow", chromedp.Sleep(300*time.Millisecond), chromedp.Evaluate(`document.documentElement.scrollWidth > window.innerWidth`, &overflow))
	if overflow {
		t.Errorf("on a 390 px wide screen the page is wider than the screen")
	}
	var phone []byte
	inBrowser(t, tab, 20*time.Second, "phone screenshot", chromedp.FullScreenshot(&phone, 100), emulation.ClearDeviceMetricsOverride())
	_ = os.WriteFile(filepath.Join(art, "console-phone.png"), phone, 0o644)

	// Signing out hides everything; a tenant token then sees only its
	// tenant.
	inBrowser(t, tab, 30*time.Second, "sign out", chromedp.Click(`#logout`, chromedp.ByQuery), chromedp.WaitVisible(`#login`))
	waitJS(t, tab, 5*time.Second, "nothing shown after signing out", `document.querySelectorAll('article.pipeline, #fleet-table tbody tr').length === 0 && sessionStorage.length === 0`)
	inBrowser(t, tab, 30*time.Second, "the fleet view", chromedp.Navigate(ui+"#"))
	inBrowser(t, tab, 20*time.Second, "sign in as team-b",
		chromedp.SendKeys(`#token`, tok.Token), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "team-b's pipeline listed", `!!document.querySelector('#fleet-table tr[data-pipeline="billing"].s-running')`)
	var seen string
	inBrowser(t, tab, 30*time.Second, "tenant view", chromedp.Evaluate(fleetRows, &seen))
	if seen != "billing@team-b" {
		t.Errorf("a team-b token sees %q, want billing@team-b", seen)
	}
	openPipeline(t, tab, ui, "billing")
	// The API refuses it another tenant's history (the page has no card
	// to ask for it), as if the pipeline did not exist.
	if code, body := apiAs(in, tok.Token, "GET", "/api/v1/pipelines/orders/history"); code != 404 {
		t.Errorf("team-b token reading orders' history: %d %s, want 404", code, body)
	}

	// A broker outage shows as backing off, with the error.
	nats.Close()
	outage := time.Now()
	took := waitJS(t, tab, 20*time.Second, "billing backing off with an error", cardState("billing")+` === 'backing off' &&
		document.querySelector('article[data-pipeline="billing"] .lasterror').textContent.length > 0`)
	var lastErr string
	inBrowser(t, tab, 30*time.Second, "last error", chromedp.Text(`article[data-pipeline="billing"] .lasterror`, &lastErr, chromedp.ByQuery))
	t.Logf("broker stopped → the page shows backing off in %s: %q", time.Since(outage).Round(10*time.Millisecond), lastErr)
	if took > 5*time.Second {
		t.Errorf("the outage took %s to show, want within 5s", took)
	}
	// The doctor, asked from the page, names the broker as the first
	// unhealthy stage.
	bill := `article[data-pipeline="billing"] `
	inBrowser(t, tab, 30*time.Second, "doctor", chromedp.Click(bill+`button[data-action="doctor"]`, chromedp.ByQuery))
	waitJS(t, tab, 40*time.Second, "the doctor naming the broker", `(() => {
		const li = document.querySelector('`+bill+`.doctor li.unhealthy');
		return !!li && li.querySelector('.st').textContent === 'broker: unhealthy' && !!li.querySelector('.action');
	})()`)
	var down []byte
	inBrowser(t, tab, 20*time.Second, "outage screenshot", chromedp.FullScreenshot(&down, 100))
	_ = os.WriteFile(filepath.Join(art, "console-outage.png"), down, 0o644)
}

// inked counts the pixels that are not the background (white, or nearly).
func inked(img image.Image) (n, total int) {
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			total++
			if r < 0xe800 || g < 0xe800 || bl < 0xe800 {
				n++
			}
		}
	}
	return n, total
}

func apiAs(in *instance, token, method, path string) (int, string) {
	req, _ := http.NewRequest(method, "http://"+in.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The same console against `ferry run -c DIR` without a store: a file
// pipeline's card says so, offers no edit but every other action, and
// each works as with a store — its offsets shown and reset while paused
// from the button, its backlog shown while paused, the doctor stopping at
// the paused relay, its dead letters listed.
func TestConsoleInBrowserWithoutStore(t *testing.T) {
	tab := browser(t)
	e := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	ctx := context.Background()
	dir := t.TempDir()
	y := fmt.Sprintf("kind: tenant\nname: team-s\nlimits: {rate: 1000}\n---\nname: shipments\ntenant: team-s\n"+
		"source: {type: xid8, dsn: %q, poll_interval: 20ms, metrics_interval: 1s}\nsink: {type: nats, url: %q, subject: %s.shipments}\n", e.DSN, e.NATS, e.Subject)
	if err := os.WriteFile(filepath.Join(dir, "shipments.yaml"), []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	in := &instance{name: "files", addr: freeAddr(t)}
	in.cmd = child([]string{"-c", dir, "--http", in.addr, "--ha=false", "--ui-sample-interval", "1s", "--log-level", "warn", "--shutdown-timeout", "3s"},
		"FERRY_ADMIN_TOKEN="+cpAdmin)
	in.cmd.Stdout, in.cmd.Stderr = os.Stderr, os.Stderr
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.kill)
	insert := func(n int) {
		for i := range n {
			if _, err := plugintest.Insert(ctx, e.Pool, fmt.Sprintf("s-%d", i%3)); err != nil {
				t.Fatal(err)
			}
		}
	}
	coll := testenv.CollectStream(t, e.NATS, e.Stream+"_UI", 100*time.Millisecond, e.Subject+".shipments")
	insert(5)
	coll.WaitFor(t, 30*time.Second, "the 5 events", func(m []testenv.Received) bool { return len(m) >= 5 })

	inBrowser(t, tab, 20*time.Second, "open the console", chromedp.Navigate("http://"+in.addr+"/ui/"), chromedp.WaitVisible(`#login`))
	inBrowser(t, tab, 30*time.Second, "sign in", chromedp.SendKeys(`#token`, cpAdmin), chromedp.Click(`#login button[type=submit]`, chromedp.ByQuery))
	card := `article[data-pipeline="shipments"] `
	waitJS(t, tab, 15*time.Second, "the file pipeline's row, with its tenant", fleetRows+` === 'shipments@team-s'`)
	openPipeline(t, tab, "http://"+in.addr+"/ui/", "shipments")
	waitJS(t, tab, 15*time.Second, "the file pipeline's card", cardState("shipments")+` === 'running' && document.querySelector('`+card+`.path').textContent.endsWith(' · file') &&
		document.querySelector('`+card+`.owner').textContent === 'this instance'`)
	var hidden string
	inBrowser(t, tab, 30*time.Second, "the actions offered", chromedp.Evaluate(`[...document.querySelectorAll('`+card+`.actions button')].filter(b => b.hidden).map(b => b.dataset.action).join()`, &hidden))
	if hidden != "edit" {
		t.Errorf("hidden actions of a file pipeline: %q, want only edit", hidden)
	}

	inBrowser(t, tab, 30*time.Second, "click pause", chromedp.Click(card+`button[data-action="pause"]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "shipments paused", cardState("shipments")+` === 'paused'`)
	insert(4)
	waitJS(t, tab, 30*time.Second, "the paused pipeline's backlog of 4", `document.querySelector('`+card+`.backlog').textContent === '4 events'`)

	inBrowser(t, tab, 30*time.Second, "open the offsets", chromedp.Click(card+`button[data-action="offsets"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "the xid8 position shown", `['id', 'xact_id', 'undelivered_events'].every(k => [...document.querySelectorAll('`+card+`.position dt')].some(d => d.textContent === k))`)
	inBrowser(t, tab, 30*time.Second, "dry-run a reset to latest", chromedp.Click(card+`.reset button[type=submit]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "the dry run's counts", `/^dry run: 0 re-sent, 4 skipped\./.test(document.querySelector('`+card+`.reset-result').textContent)`)
	inBrowser(t, tab, 30*time.Second, "apply the reset", chromedp.Click(card+`button[data-action="reset-apply"]`, chromedp.ByQuery))
	waitJS(t, tab, 30*time.Second, "the reset applied", `/^reset: 0 re-sent, 4 skipped\./.test(document.querySelector('`+card+`.reset-result').textContent)`)

	inBrowser(t, tab, 30*time.Second, "doctor", chromedp.Click(card+`button[data-action="doctor"]`, chromedp.ByQuery))
	// The walk runs on the instance, which finds no relay reading the
	// paused pipeline's source.
	waitJS(t, tab, 40*time.Second, "the doctor stopping at the paused relay", `(() => {
		const li = document.querySelector('`+card+`.doctor li.unhealthy');
		return !!li && li.querySelector('.st').textContent === 'relay: unhealthy' &&
			document.querySelector('`+card+`.action-result').textContent === 'doctor: first unhealthy stage relay';
	})()`)
	inBrowser(t, tab, 30*time.Second, "dead letters", chromedp.Click(card+`button[data-action="deadletters"]`, chromedp.ByQuery))
	waitJS(t, tab, 10*time.Second, "no dead letters for xid8", `document.querySelector('`+card+`.dl-summary').textContent.includes('parks no events')`)

	inBrowser(t, tab, 30*time.Second, "click resume", chromedp.Click(card+`button[data-action="resume"]`, chromedp.ByQuery))
	waitJS(t, tab, 15*time.Second, "shipments running again", cardState("shipments")+` === 'running'`)
}
