package demo_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/demo"
	"github.com/ferryhq/ferry/lab/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The demo (`make demo`) keeps working: a short run delivers every event in
// order and prints its summary.
func TestDemoShortRun(t *testing.T) {
	var out bytes.Buffer
	sum, err := demo.Run(context.Background(), demo.Options{
		Duration: 3 * time.Second, DatabaseURL: testenv.Postgres(t), NATSURL: testenv.NATS(t), Out: &out,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !sum.OK() || sum.Delivered != sum.Written || sum.Written < 50 {
		t.Fatalf("summary %+v\n%s", sum, out.String())
	}
	if !strings.Contains(out.String(), "demo OK") {
		t.Fatalf("no verdict line:\n%s", out.String())
	}
}
