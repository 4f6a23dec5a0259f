// Package redact keeps secrets out of logs, errors and `validate` output:
// passwords in URLs (postgres://u:secret@h) and key/value DSNs
// (password=secret), and tokens in NATS URLs (nats://token@h).
//
// It imports no other Ferry package, so any package may import it.
package redact

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
)

// Mask replaces a secret.
const Mask = "xxxxx"

var (
	// scheme://user:password@ → keep user, mask password.
	urlPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^/:@\s]*):[^@\s/]*@`)
	// NATS token auth puts the token where a user name would be.
	natsToken = regexp.MustCompile(`((?:nats|tls|wss?)://)[^/:@\s]+@`)
	// password=secret or password='sec ret' in a key/value DSN; also
	// sslpassword, and the same for "token" and "secret" keys.
	kvSecret = regexp.MustCompile(`(?i)\b((?:ssl)?password|token|secret)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)`)
)

// String returns s with every recognised secret masked.
func String(s string) string {
	s = urlPassword.ReplaceAllString(s, "$1:"+Mask+"@")
	s = natsToken.ReplaceAllString(s, "${1}"+Mask+"@")
	s = kvSecret.ReplaceAllString(s, "$1="+Mask)
	return s
}

// Error wraps err so that its message is redacted; errors.Is and As still see
// the original.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return redacted{err}
}

type redacted struct{ err error }

func (r redacted) Error() string { return String(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

// A Go-quoted fragment ("…" with escapes), as url, strconv and amqp errors
// quote the text they could not read.
var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// Unparsed wraps the error of a connection string or URL that did not parse
// so that its message no longer quotes the value: a malformed value is too
// ambiguous for String to find the password in (`hunter2` alone is not a
// DSN, `nats://to ken@h` is not a URL), and the user has the value anyway.
// errors.Is and As still see the original.
func Unparsed(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	// pgx: "cannot parse `<dsn>`: failed to parse as URL (<cause>)".
	if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
		if i := strings.LastIndex(rest, "`: "); i >= 0 {
			msg = rest[i+len("`: "):]
		} else {
			msg = "cannot parse"
		}
	}
	return unparsed{String(quoted.ReplaceAllString(msg, `"…"`)), err}
}

type unparsed struct {
	msg string
	err error
}

func (u unparsed) Error() string { return u.msg }
func (u unparsed) Unwrap() error { return u.err }

// Handler wraps a slog.Handler so that the message and every string or error
// attribute are redacted before they are written.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ next slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, String(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = attr(a)
	}
	return handler{h.next.WithAttrs(red)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.next.WithGroup(name)} }

func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, String(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = attr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		// fmt, not the methods themselves: it turns a nil pointer's panic
		// in Error or String (a nil *time.Time) into text.
		switch x := v.Any().(type) {
		case error, fmt.Stringer:
			return slog.String(a.Key, String(fmt.Sprint(x)))
		}
	}
	return a
}
