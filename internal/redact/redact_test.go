package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"postgres://ferry:s3cret@db:5432/app?sslmode=require", "postgres://ferry:xxxxx@db:5432/app?sslmode=require"},
		{"dial amqp://guest:guest@127.0.0.1:5672/: refused", "dial amqp://guest:xxxxx@127.0.0.1:5672/: refused"},
		{"host=db user=ferry password=s3cret dbname=app", "host=db user=ferry password=xxxxx dbname=app"},
		{"host=db password='s3 cret' dbname=app", "host=db password=xxxxx dbname=app"},
		{"nats://t0ken@nats:4222", "nats://xxxxx@nats:4222"},
		{"postgres://ferry@db/app", "postgres://ferry@db/app"},
		{"no secrets here", "no secrets here"},
	}
	for _, c := range cases {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestErrorAndHandler(t *testing.T) {
	base := errors.New("connect postgres://u:hunter2@h/db failed")
	err := Error(base)
	if strings.Contains(err.Error(), "hunter2") || !errors.Is(err, base) {
		t.Fatalf("Error: %q (Is=%v)", err, errors.Is(err, base))
	}
	var buf bytes.Buffer
	log := slog.New(Handler(slog.NewTextHandler(&buf, nil))).With("dsn", "postgres://u:hunter2@h/db")
	log.Error("connect password=hunter2", "err", base, slog.Group("g", "url", "amqp://a:hunter2@h"))
	if strings.Contains(buf.String(), "hunter2") {
		t.Fatalf("secret in log: %s", buf.String())
	}
}

func TestUnparsed(t *testing.T) {
	cases := []struct{ in, want string }{
		// pgx quotes the whole DSN; a bare word is no recognisable secret.
		{"cannot parse `hunter2`: failed to parse as keyword/value (invalid keyword/value)",
			"failed to parse as keyword/value (invalid keyword/value)"},
		{"cannot parse `a`: b` c`: failed to parse as URL (x)", "failed to parse as URL (x)"},
		{`parse "nats://to ken@h": invalid character " " in host name`, `parse "…": invalid character "…" in host name`},
		{`invalid port: strconv.ParseUint: parsing "hun\"ter2": invalid syntax`, `invalid port: strconv.ParseUint: parsing "…": invalid syntax`},
	}
	for _, c := range cases {
		base := errors.New(c.in)
		err := Unparsed(base)
		if err.Error() != c.want || !errors.Is(err, base) {
			t.Errorf("Unparsed(%q) = %q (Is=%v), want %q", c.in, err, errors.Is(err, base), c.want)
		}
	}
	if Unparsed(nil) != nil {
		t.Error("Unparsed(nil) is not nil")
	}
}

// A nil pointer whose String or Error method would panic is logged, not a
// crash of the request that logged it.
func TestHandlerNilStringer(t *testing.T) {
	var b strings.Builder
	log := slog.New(Handler(slog.NewTextHandler(&b, nil)))
	var when *time.Time
	var err *url.Error
	log.Info("x", "expires_at", when, "err", err)
	if !strings.Contains(b.String(), "expires_at=<nil>") {
		t.Fatalf("logged %q", b.String())
	}
}
