package doctor_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry/doctor"
	"github.com/ferryhq/ferry/lab/relaytest"
	"github.com/ferryhq/ferry/lab/testenv"
)

// lockedBuffer is a log destination the doctor's goroutines may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The components the doctor builds do not log where the report goes: the
// Kafka sink's "connected" INFO line showed up in `ferry doctor`'s output.
func TestDoctorBuildsQuietComponents(t *testing.T) {
	e := relaytest.Setup(t, harness)
	srv := testenv.StartKafka(t)
	topic := strings.ToLower(e.Stream)
	testenv.CreateKafkaTopic(t, []string{srv.Addr()}, topic, 1)
	y := fmt.Sprintf("name: quiet\nsource: {type: xid8, dsn: %q}\nsink: {type: kafka, brokers: [%q], topic: %s}\n", e.DSN, srv.Addr(), topic)

	var logged lockedBuffer
	was := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(was)
	// A running Ferry says it runs the pipeline, so the walk reaches the
	// broker, whose check starts the sink.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"pipelines": [{"name": "quiet", "state": "running"}]}`)
	}))
	defer api.Close()
	o := opts
	o.URL = api.URL
	r := doctor.Run(context.Background(), load(t, y), o)

	var broker *doctor.Check
	for i, c := range r.Pipelines[0].Checks {
		if c.Stage == doctor.StageBroker {
			broker = &r.Pipelines[0].Checks[i]
		}
	}
	if broker == nil || broker.Status != doctor.OK {
		t.Fatalf("the broker check did not connect the sink: %+v", r.Pipelines[0])
	}
	if s := logged.String(); s != "" {
		t.Fatalf("the doctor's components logged:\n%s", s)
	}
}
