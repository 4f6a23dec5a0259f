package pipelines

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// MinMaskLen is the shortest value Spec.Mask hides: hiding "1" or "nats"
// everywhere would garble every line and say little.
const MinMaskLen = 4

// maskedSecret replaces a filled-in value whose reference is not known
// (Masks set by hand).
const maskedSecret = "[secret]"

// masksOf turns what references filled in into Spec.Masks and the
// reference that names each.
func masksOf(refs []filledRef) ([]string, map[string]string) {
	var masks []string
	names := map[string]string{}
	for _, r := range refs {
		if len(r.value) < MinMaskLen {
			continue
		}
		if _, dup := names[r.value]; dup {
			continue
		}
		names[r.value] = "${" + r.name + "}"
		masks = append(masks, r.value)
	}
	if len(masks) == 0 {
		return nil, nil
	}
	// Longest first: a value may contain a shorter one.
	slices.SortStableFunc(masks, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return masks, names
}

// Mask replaces, in text, every value of Masks — as is, and as Go quoting
// and URL escaping would show it inside an error — with the reference that
// filled it in (${DB_URL}), or [secret]. The supervisor passes the
// pipeline's last error and every log line of the pipeline through it: a
// value from a secret is not shown even where redaction cannot recognise it
// (a database name, a token under the wrong key).
func (s *Spec) Mask(text string) string {
	if s == nil || len(s.Masks) == 0 || text == "" {
		return text
	}
	var pairs []string
	for _, v := range s.Masks {
		with := maskedSecret
		if ref, ok := s.maskRefs[v]; ok {
			with = ref
		}
		quoted := strconv.Quote(v)
		for _, form := range []string{v, quoted[1 : len(quoted)-1], url.PathEscape(v), url.QueryEscape(v)} {
			if len(form) >= MinMaskLen && !slices.Contains(pairs, form) {
				pairs = append(pairs, form, with)
			}
		}
	}
	// One pass, longest first at each position (Masks are sorted, and a
	// form is no shorter than its value): a replacement is never searched
	// again.
	return strings.NewReplacer(pairs...).Replace(text)
}

// maskHandler passes the message and every attribute of a pipeline's log
// records through its spec's Mask before the next handler sees them.
type maskHandler struct {
	next slog.Handler
	mask func(string) string
}

// MaskLogger wraps l so that the spec's Mask applies to every record; l
// as is when there is nothing to hide.
func (spec *Spec) MaskLogger(l *slog.Logger) *slog.Logger {
	if len(spec.Masks) == 0 {
		return l
	}
	return slog.New(maskHandler{next: l.Handler(), mask: spec.Mask})
}

func (h maskHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h maskHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.mask(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h maskHandler) WithAttrs(as []slog.Attr) slog.Handler {
	masked := make([]slog.Attr, len(as))
	for i, a := range as {
		masked[i] = h.attr(a)
	}
	return maskHandler{next: h.next.WithAttrs(masked), mask: h.mask}
}

func (h maskHandler) WithGroup(name string) slog.Handler {
	return maskHandler{next: h.next.WithGroup(name), mask: h.mask}
}

// attr masks a's value. Values that are not text (numbers, durations,
// times) are left as they are; anything else is rendered as text, and
// replaced by its masked text when the mask changed it.
func (h maskHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.mask(v.String()))
	case slog.KindGroup:
		g := v.Group()
		masked := make([]any, len(g))
		for i, ga := range g {
			masked[i] = h.attr(ga)
		}
		return slog.Group(a.Key, masked...)
	case slog.KindAny:
		var text string
		switch x := v.Any().(type) {
		case error:
			text = x.Error()
		case fmt.Stringer:
			text = x.String()
		default:
			text = fmt.Sprint(x)
		}
		if m := h.mask(text); m != text {
			return slog.String(a.Key, m)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// MaskError is err with its text passed through Mask; errors.Is and As
// still see err.
func (s *Spec) MaskError(err error) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	if m := s.Mask(text); m != text {
		return maskedError{m, err}
	}
	return err
}

type maskedError struct {
	msg string
	err error
}

func (m maskedError) Error() string { return m.msg }
func (m maskedError) Unwrap() error { return m.err }
