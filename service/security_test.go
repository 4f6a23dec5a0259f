package service_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins/plugintest"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

// TestNoSecretInAnyOutput runs ferry with a password in every DSN and URL
// and an admin token, through start-up, delivery, an API call, a refused
// reload, doctor, validate and shutdown — at debug level — and finds none
// of them in anything it printed or served.
func TestNoSecretInAnyOutput(t *testing.T) {
	const dbPassword, natsPassword, token = "db-Pa55word-1", "nats-Pa55word-2", "admin-T0ken-3"
	amqpUser, amqpPassword := strings.ReplaceAll(testenv.Name("ferrysec"), "_", ""), "amqp-Pa55word-4"
	testenv.RabbitMQCtl(t, "add_user", amqpUser, amqpPassword)
	t.Cleanup(func() { exec.Command("rabbitmqctl", "delete_user", amqpUser).Run() })
	testenv.RabbitMQCtl(t, "set_permissions", amqpUser, ".*", ".*", ".*")
	secrets := []string{dbPassword, natsPassword, token, amqpPassword}

	x := relaytest.Setup(t, plugintest.SourceHarness{Type: xid8.Name, Schema: xid8.Schema})
	w := relaytest.Setup(t, plugintest.SourceHarness{Type: wal.Name, Schema: wal.Schema})
	withPassword := func(raw, password string) string {
		u, _ := url.Parse(raw)
		user := "ferry"
		if u.User != nil && u.User.Username() != "" {
			user = u.User.Username()
		}
		u.User = url.UserPassword(user, password)
		return u.String()
	}
	// Trust auth and an open NATS accept any password; they must still never show.
	natsURL := withPassword(x.NATS, natsPassword)
	amqp := fmt.Sprintf("amqp://%s:%s@127.0.0.1:5672/", amqpUser, amqpPassword)
	walName := strings.ToLower(testenv.Name("sec_wal"))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "p.yaml"), []byte(fmt.Sprintf(`name: sec-xid8
source: {type: xid8, dsn: %q, poll_interval: 20ms}
transforms: [{type: canary, topic: %s.canary, generate: {interval: 200ms}}]
sink: {type: nats, url: %q, subject: %s}
---
name: %s
source: {type: wal, dsn: %q}
sink: {type: rabbitmq, url: %q, exchange: amq.topic, routing_key: sec.wal}
`, withPassword(x.DSN, dbPassword), x.Subject, natsURL, x.Subject, walName, withPassword(w.DSN, dbPassword), amqp)), 0o600)
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)

	addr := freeAddr(t)
	cmd := child([]string{"-c", dir, "--http", addr,
		"--admin-token-file", tokenFile, "--log-level", "debug", "--ha=false", "--shutdown-timeout", "2s"})
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	ctx := context.Background()
	plugintest.Insert(ctx, x.Pool, "agg-1")
	plugintest.Insert(ctx, w.Pool, "agg-1")
	x.Coll.WaitFor(t, 30*time.Second, "the xid8 event", func(m []testenv.Received) bool { return len(m) >= 1 })

	var served strings.Builder
	for _, path := range []string{"/api/v1/pipelines", "/metrics", "/readyz"} {
		served.WriteString(get(t, "http://"+addr+path))
	}
	// A reload that must be refused (a broken file), authorised by the token.
	os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte(fmt.Sprintf("name: broken\nsource: {type: xid8, dsn: 'postgres://u:%s@h:port/d'}\nsink: {type: nats, subject: 'a b'}\n", dbPassword)), 0o600)
	req, _ := http.NewRequest("POST", "http://"+addr+"/api/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 422 {
		t.Errorf("reload of a broken file: %d %s", resp.StatusCode, body)
	}
	served.Write(body)

	// The other commands, on the same files.
	for _, args := range [][]string{{"validate", "-c", dir}, {"doctor", "-c", dir, "--json", "--sample", "0", "--url", "http://" + addr}} {
		_, o, e := ferry(t, args...)
		served.WriteString(o + e)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	all := out.String() + served.String()
	if !strings.Contains(all, "sec-xid8") || !strings.Contains(all, "ferry_pipeline_state") {
		t.Fatalf("the run did not get far enough to mean anything:\n%s", all)
	}
	for _, s := range secrets {
		if i := strings.Index(all, s); i >= 0 {
			t.Errorf("secret %q printed: …%s…", s, all[max(0, i-120):min(len(all), i+40)])
		}
	}
}
