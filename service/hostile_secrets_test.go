package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/lab/testenv"
)

// The hostile tenant fills the store with secrets: past its quota (by
// default 100 secrets, 1 MiB) each put is refused, saying the limit and
// what it holds, and team-a is not held back. Secrets no pipeline refers
// to cost the instance nothing at convergence: one that does not even open
// goes unnoticed, and the instance's heap does not carry them.
func TestHostileTenantSecrets(t *testing.T) {
	h := startHostile(t)
	const b = "tenant:team-b"
	put := func(caller, tenant, name, value string) (int, string) {
		return h.call("PUT", "/api/v1/tenants/"+tenant+"/secrets/"+name, caller, jsonBody("value", value))
	}
	big := strings.Repeat("b", 64<<10)

	// Bytes: beside its DB_URL, fifteen values of 64 KiB fit in 1 MiB and
	// the sixteenth does not.
	for i := range 16 {
		code, body := put(b, "team-b", fmt.Sprintf("BIG_%02d", i), big)
		if i < 15 && code != 200 {
			t.Fatalf("secret %d of 64 KiB: %d %s", i, code, body)
		}
		if i == 15 && (code != 422 || !strings.Contains(body, "tenant team-b's secrets hold") || !strings.Contains(body, "max_secret_bytes 1048576")) {
			t.Fatalf("the sixteenth 64 KiB secret: %d %s", code, body)
		}
	}
	// Count: small values up to the hundredth secret, then a refusal.
	stored := 16
	for ; stored <= 100; stored++ {
		code, body := put(b, "team-b", fmt.Sprintf("SMALL_%03d", stored), "x")
		if code == 422 {
			if !strings.Contains(body, "tenant team-b has 100 secrets of its max_secrets 100") || strings.Contains(body, "team-a") {
				t.Fatalf("past max_secrets: %s", body)
			}
			break
		}
		if code != 200 {
			t.Fatalf("secret %d: %d %s", stored, code, body)
		}
	}
	if stored != 100 {
		t.Fatalf("team-b stored %d secrets, want the default max_secrets, 100", stored)
	}
	if code, body := put("tenant:team-a", "team-a", "EXTRA", big); code != 200 {
		t.Fatalf("team-a, after team-b filled its quota: %d %s", code, body)
	}
	if code, body := h.call("PUT", "/api/v1/tenants/team-b", b, `{"limits": {"max_secrets": 100000}}`); code != 403 {
		t.Fatalf("team-b raised its own secret quota: %d %s", code, body)
	}

	// The admin raises the quotas for two hundred 64 KiB secrets: what the
	// instance's memory is measured with.
	h.admin(t, "PUT", "/api/v1/tenants/team-b", `{"limits": {"max_secrets": 400, "max_secret_bytes": 16777216}}`)
	// Every put asks for a convergence: the peak is sampled as they go.
	var peakHeap float64
	for i := 15; i < 200; i++ {
		if code, body := put(b, "team-b", fmt.Sprintf("BIG_%02d", i), big); code != 200 {
			t.Fatalf("secret %d under the raised quota: %d %s", i, code, body)
		}
		if i%10 == 0 {
			heap, _ := h.memory(t)
			peakHeap = max(peakHeap, heap)
		}
	}
	// One team-b's pipelines do not use no longer opens.
	logged := len(h.logs.String())
	pool := mustPool(t, h.store)
	if _, err := pool.Exec(context.Background(), `UPDATE ferry_secrets SET ciphertext = 'not sealed' WHERE tenant = 'team-b' AND name = 'BIG_03'`); err != nil {
		t.Fatal(err)
	}
	// team-b's pipeline uses its DB_URL; it runs after a convergence that
	// read the store with the broken secret in it.
	if code, body := h.call("POST", "/api/v1/pipelines", b, h.pipeline("b-quota", "team-b", "${DB_URL}", "team-b.quota", "")); code != 201 {
		t.Fatalf("team-b's pipeline: %d %s", code, body)
	}
	testenv.Eventually(t, 60*time.Second, "team-b's pipeline running", func() bool {
		_, body := h.call("GET", "/api/v1/pipelines/b-quota", b, "")
		var p struct{ State string }
		return json.Unmarshal([]byte(body), &p) == nil && p.State == "running"
	})
	heap, rss := h.memory(t)
	t.Logf("team-b holds 200 secrets of 64 KiB and 85 small ones; the instance's Go heap in use peaked at %.1f MiB while they were put; now %.1f MiB, RSS %.1f MiB",
		max(peakHeap, heap)/(1<<20), heap/(1<<20), rss/(1<<20))
	if logs := h.logs.String()[logged:]; strings.Contains(logs, "BIG_03") || strings.Contains(logs, "do not open") {
		t.Errorf("a secret no pipeline refers to was opened:\n%s", logs)
	}
}

// memory reads the instance's Go heap in use and resident memory, in
// bytes, from its metrics.
func (h *hostile) memory(t *testing.T) (heap, rss float64) {
	t.Helper()
	code, body := h.callFrom(h.clientAddr("metrics"), "GET", "/metrics", "metrics-token-Zp2", "")
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		v, _ := strconv.ParseFloat(value, 64)
		switch name {
		case "go_memstats_heap_inuse_bytes":
			heap = v
		case "process_resident_memory_bytes":
			rss = v
		}
	}
	if heap == 0 || rss == 0 {
		t.Fatalf("metrics without the heap or the RSS")
	}
	return heap, rss
}
