package plugins

import (
	"errors"
	"fmt"
	"time"
)

// FieldError is a problem with one configuration key. Path is the key's YAML
// path relative to the component ("columns.id"); the loader prefixes the
// component's own path and the file and line.
type FieldError struct {
	Path string
	Msg  string
}

// Error returns "path: msg".
func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// FieldErrorf returns a *FieldError for path.
func FieldErrorf(path, format string, args ...any) error {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// Problems collects validation errors; Err joins them (nil when empty).
// It keeps Validate methods short:
//
//	var p plugins.Problems
//	if c.URL == "" { p.Add("url", "must not be empty") }
//	return p.Err()
type Problems []error

// Add records a problem with the key at path.
func (p *Problems) Add(path, format string, args ...any) {
	*p = append(*p, FieldErrorf(path, format, args...))
}

// Nest records the problems of a nested config under prefix.
func (p *Problems) Nest(prefix string, err error) {
	for _, e := range Flatten(err) {
		var fe *FieldError
		if errors.As(e, &fe) {
			path := prefix
			if fe.Path != "" {
				path += "." + fe.Path
			}
			*p = append(*p, &FieldError{Path: path, Msg: fe.Msg})
			continue
		}
		*p = append(*p, &FieldError{Path: prefix, Msg: e.Error()})
	}
}

// Err joins the problems, or returns nil.
func (p Problems) Err() error { return errors.Join(p...) }

// Flatten unwraps errors.Join trees into their leaves.
func Flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// FormatTime renders t the way Ferry's time metadata is written: RFC 3339 in
// UTC with microseconds, the precision of a PostgreSQL timestamptz.
func FormatTime(t time.Time) string {
	var b [len(timeLayout)]byte
	return string(AppendTime(b[:0], t))
}

// timeLayout is FormatTime's layout; in UTC its zone is always "Z", so a
// formatted time of years 0 to 9999 is always as long as the layout minus
// the zone's "07:00".
const timeLayout = "2006-01-02T15:04:05.000000Z07:00"

// AppendTime appends FormatTime(t) to b. Sources stamp every event with
// several times: writing the digits directly, rather than interpreting the
// layout each time, is several times cheaper, and lets a caller format
// more than one into one buffer.
func AppendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, timeLayout) // a sign or a fifth digit
	}
	hour, minute, sec := t.Clock()
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.')
	us := t.Nanosecond() / 1000 // truncated, as Format's .000000 does
	for d := 100000; d > 0; d /= 10 {
		b = append(b, byte('0'+us/d%10))
	}
	return append(b, 'Z')
}

// ParseTime parses a time written by FormatTime (any RFC 3339 time).
func ParseTime(s string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, s)
}

// PermanentError is a failure that retrying cannot fix (no route for the
// event, a payload the broker refuses as too large, a message no queue
// accepts). The pipeline sends such events to its dead-letter topic, with
// Reason, instead of retrying them.
type PermanentError struct {
	// Reason is a short code for the dead-letter header: no_route,
	// undecodable_payload, oversize, unroutable, …
	Reason string
	Err    error
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent with a reason code.
func Permanent(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Reason: reason, Err: err}
}

// IsPermanent reports whether err (or an error it wraps) is permanent, and
// its reason.
func IsPermanent(err error) (string, bool) {
	var p *PermanentError
	if errors.As(err, &p) {
		return p.Reason, true
	}
	return "", false
}
