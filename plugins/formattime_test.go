package plugins_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

// FuzzFormatTime holds FormatTime to the layout it writes by hand, for any
// instant and zone, and ParseTime to reading it back.
func FuzzFormatTime(f *testing.F) {
	for _, t := range []time.Time{{}, time.Unix(0, 0), time.Unix(1700000000, 999999999),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(0, 1, 1, 0, 0, 0, 1000, time.UTC)} {
		f.Add(t.Unix(), int64(t.Nanosecond()), 0)
	}
	f.Add(int64(1700000000), int64(123456789), -7*3600)
	f.Fuzz(func(t *testing.T, sec, nsec int64, zone int) {
		at := time.Unix(sec, nsec).In(time.FixedZone("z", zone%(24*3600)))
		want := at.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
		if got := plugins.FormatTime(at); got != want {
			t.Fatalf("FormatTime(%v) = %q, want %q", at, got, want)
		}
		if got := string(plugins.AppendTime([]byte("x"), at)); got != "x"+want {
			t.Fatalf("AppendTime(%v) = %q, want %q", at, got, "x"+want)
		}
		if y := at.UTC().Year(); y < 1 || y > 9999 {
			return // RFC 3339 has four-digit years; Truncate counts from year 1
		}
		back, err := plugins.ParseTime(want)
		if err != nil || !back.Equal(at.Truncate(time.Microsecond)) {
			t.Fatalf("ParseTime(%q) = %v, %v", want, back, err)
		}
	})
}
