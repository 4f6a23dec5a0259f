package nats_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/lab/testenv"
	"github.com/ferryhq/ferry/plugins"
	natssink "github.com/ferryhq/ferry/sinks/nats"
)

// tenantSink is a sink of tenant's pipeline named pipeline, publishing to
// subject and creating stream.
func tenantSink(t *testing.T, url, tenant, pipeline, subject string, stream *natssink.StreamConfig) *natssink.Sink {
	t.Helper()
	cfg := natssink.DefaultConfig()
	cfg.URL, cfg.Subject, cfg.CreateStream = url, subject, stream
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := natssink.New(cfg, plugins.Env{Pipeline: pipeline, Tenant: tenant})
	t.Cleanup(func() { s.Close() })
	return s
}

// streamInfo is the stream's info as the server has it now; nil when the
// stream does not exist.
func streamInfo(t *testing.T, url, name string) *jetstream.StreamInfo {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err == jetstream.ErrStreamNotFound {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo()
}

// publishRaw stores n messages on subject, as another tenant's relay would.
func publishRaw(t *testing.T, url, subject string, n int) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for i := range n {
		if _, err := js.Publish(context.Background(), subject, []byte{byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
	}
}

// A pipeline naming a stream that exists and is not its tenant's — made
// by hand, or by Ferry for another tenant — never changes it: neither its
// subjects, its limits, nor its messages. The start fails saying so,
// without naming the owner; a dry start (a connect check) fails the same.
func TestForeignStreamIsNeverChanged(t *testing.T) {
	url := testenv.NATS(t)
	base := testenv.Name("foreign")
	for _, c := range []struct {
		name     string
		metadata map[string]string
	}{
		{name: "made by hand"},
		{name: "made for another tenant", metadata: map[string]string{"ferry-tenant": "team-b", "ferry-pipeline": "b-orders"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := strings.ToUpper(base + "_" + strings.ReplaceAll(c.name, " ", "_"))
			bSubject := strings.ToLower(name) + ".b"
			createStream(t, url, jetstream.StreamConfig{Name: name, Subjects: []string{bSubject + ".>"}, Metadata: c.metadata})
			publishRaw(t, url, bSubject+".orders", 5)

			hijack := strings.ToLower(name) + ".a.hijack"
			s := tenantSink(t, url, "team-a", "a-hijack", hijack, &natssink.StreamConfig{Name: name, Subjects: []string{hijack}, MaxMsgs: 1, MaxAge: time.Second})
			_, dryErr := s.DryStart(context.Background())
			err := s.Start(context.Background())
			for _, err := range []error{dryErr, err} {
				want := "stream " + name + " exists and is not this tenant's: it does not capture " + hijack
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("start: %v, want an error saying %q", err, want)
					continue
				}
				if strings.Contains(err.Error(), "team-b") {
					t.Errorf("the error names the stream's owner: %v", err)
				}
			}
			info := streamInfo(t, url, name)
			switch {
			case info == nil:
				t.Fatal("the stream is gone")
			case !slices.Equal(info.Config.Subjects, []string{bSubject + ".>"}):
				t.Errorf("subjects %v, want [%s.>]", info.Config.Subjects, bSubject)
			case info.Config.MaxMsgs != -1 || info.Config.MaxAge != 0:
				t.Errorf("limits changed: max_msgs %d, max_age %s", info.Config.MaxMsgs, info.Config.MaxAge)
			case info.State.Msgs != 5:
				t.Errorf("the stream holds %d messages, want 5", info.State.Msgs)
			case info.Config.Metadata["ferry-tenant"] != c.metadata["ferry-tenant"]:
				t.Errorf("metadata %v", info.Config.Metadata)
			}
		})
	}
}

// A stream another tenant owns that captures every subject the pipeline
// needs is used as it is: the pipeline publishes into it, and its settings
// stay the owner's.
func TestForeignStreamThatFitsIsUsedAsIs(t *testing.T) {
	url := testenv.NATS(t)
	name := strings.ToUpper(testenv.Name("fits"))
	subject := strings.ToLower(name) + ".a"
	createStream(t, url, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"},
		Metadata: map[string]string{"ferry-tenant": "team-b"}})
	s := tenantSink(t, url, "team-a", "a-orders", subject+".x", &natssink.StreamConfig{Name: name, Subjects: []string{subject + ".>"}, MaxMsgs: 1})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"0b5c1f9e-0000-4000-8000-00000000000a", "0b5c1f9e-0000-4000-8000-00000000000b"} {
		if err := s.Publish("", message.NewMessage(id, []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	info := streamInfo(t, url, name)
	if info.Config.MaxMsgs != -1 || info.State.Msgs != 2 || info.Config.Metadata["ferry-tenant"] != "team-b" {
		t.Errorf("max_msgs %d, %d messages, metadata %v: want the owner's stream unchanged holding both", info.Config.MaxMsgs, info.State.Msgs, info.Config.Metadata)
	}
}

// A tenant's stream is created with the mark of its tenant and pipeline;
// another pipeline of the tenant reuses it and may change its settings;
// another tenant's pipeline may not; a dry start creates nothing.
func TestOwnStreamIsMarkedAndReused(t *testing.T) {
	url := testenv.NATS(t)
	name := strings.ToUpper(testenv.Name("own"))
	subject := strings.ToLower(name) + ".a"
	t.Cleanup(func() { deleteStream(url, name) })

	dry := tenantSink(t, url, "team-a", "a-orders", subject+".x", &natssink.StreamConfig{Name: name, Subjects: []string{subject + ".>"}, Storage: "memory"})
	notes, err := dry.DryStart(context.Background())
	if err != nil || len(notes) != 1 || !strings.Contains(notes[0], "would create stream "+name) {
		t.Fatalf("dry start: %q, %v; want a note that it would create the stream", notes, err)
	}
	if streamInfo(t, url, name) != nil {
		t.Fatal("a dry start created the stream")
	}

	first := tenantSink(t, url, "team-a", "a-orders", subject+".x", &natssink.StreamConfig{Name: name, Subjects: []string{subject + ".>"}, Storage: "memory"})
	if err := first.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	info := streamInfo(t, url, name)
	if info == nil || info.Config.Metadata["ferry-tenant"] != "team-a" || info.Config.Metadata["ferry-pipeline"] != "a-orders" {
		t.Fatalf("created stream %+v, want it marked as team-a's a-orders", info)
	}

	second := tenantSink(t, url, "team-a", "a-audit", subject+".y", &natssink.StreamConfig{Name: name, Subjects: []string{subject + ".>"}, Storage: "memory", MaxMsgs: 7})
	if err := second.Start(context.Background()); err != nil {
		t.Fatalf("the tenant's second pipeline on its stream: %v", err)
	}
	if info := streamInfo(t, url, name); info.Config.MaxMsgs != 7 || info.Config.Metadata["ferry-pipeline"] != "a-orders" {
		t.Errorf("max_msgs %d, metadata %v: want 7, the mark of its creator", info.Config.MaxMsgs, info.Config.Metadata)
	}

	other := tenantSink(t, url, "team-b", "b-orders", "x.b", &natssink.StreamConfig{Name: name, Subjects: []string{"x.b"}, MaxMsgs: 1})
	if err := other.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "is not this tenant's") {
		t.Fatalf("another tenant's start: %v, want refused", err)
	}
	if info := streamInfo(t, url, name); info.Config.MaxMsgs != 7 || !slices.Equal(info.Config.Subjects, []string{subject + ".>"}) {
		t.Errorf("another tenant changed the stream: max_msgs %d, subjects %v", info.Config.MaxMsgs, info.Config.Subjects)
	}
}

func deleteStream(url, name string) {
	nc, err := nats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteStream(ctx, name)
}
