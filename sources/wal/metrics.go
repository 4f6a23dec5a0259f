package wal

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/internal/pgsource"
)

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// slotMetrics are the per-slot gauges, labelled by slot (the Registerer in
// plugins.Env adds pipeline and tenant).
type slotMetrics struct {
	slot        string
	retained    *prometheus.GaugeVec
	unconfirmed *prometheus.GaugeVec
	active      *prometheus.GaugeVec
	status      *prometheus.GaugeVec
	safe        *prometheus.GaugeVec
	// behind is set for members of a shared stream only.
	behind *prometheus.GaugeVec
}

func newSlotMetrics(slot string) *slotMetrics {
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ferry", Subsystem: "wal", Name: name, Help: help},
			append([]string{"slot"}, labels...))
	}
	return &slotMetrics{
		slot: slot,
		retained: gauge("slot_retained_wal_bytes",
			"WAL the server keeps for the slot: pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn). Grows without bound when the pipeline stalls."),
		unconfirmed: gauge("slot_unconfirmed_bytes",
			"WAL written since the slot's confirmed position: pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)."),
		active: gauge("slot_active", "1 while a process streams the slot."),
		status: gauge("slot_wal_status",
			"1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others. lost means events were missed.", "wal_status"),
		safe: gauge("slot_safe_wal_size_bytes",
			"WAL that can still be written before the slot is invalidated (safe_wal_size); -1 when max_slot_wal_keep_size is unlimited."),
		behind: gauge("shared_member_behind_bytes",
			"WAL written since this pipeline's position in its shared slot (slot_mode: shared); the slot retains at least the largest of its members'."),
	}
}

func (m *slotMetrics) collectors() []*prometheus.GaugeVec {
	return []*prometheus.GaugeVec{m.retained, m.unconfirmed, m.active, m.status, m.safe, m.behind}
}

// register adds the gauges to reg. They are never unregistered: the
// supervisor's Registerer lets a restarted pipeline's source take the
// collectors over, and unregistering at stop could remove the successor's.
// On a plain registry a second source of the same pipeline reuses them.
func (m *slotMetrics) register(reg prometheus.Registerer, log *slog.Logger) {
	if reg == nil {
		return
	}
	for _, c := range m.collectors() {
		err := reg.Register(c)
		var are prometheus.AlreadyRegisteredError
		switch {
		case err == nil:
		case errors.As(err, &are):
			if existing, ok := are.ExistingCollector.(*prometheus.GaugeVec); ok {
				*c = *existing
			}
		default:
			log.Warn("register slot metrics", "err", err)
		}
	}
}

// watch measures the slot every MetricsInterval, until ctx ends: the
// gauges, Health, and warnings when the slot is about to be, or was,
// invalidated. oldest is the commit time of the oldest transaction read and
// not confirmed (zero for none), the oldest undelivered event's age.
func (m *slotManager) watch(ctx context.Context, oldest func() time.Time) {
	last := ""
	pgsource.WatchHealth(ctx, m.cfg.MetricsInterval, m.log, "measure replication slot", &m.health, func(ctx context.Context) error {
		sh, err := readSlotHealth(ctx, m.pool, m.slot)
		if err != nil {
			return err
		}
		m.metrics.set(sh)
		m.health.Store(sh.health(oldest()))
		if sh.status != last {
			switch sh.status {
			case "unreserved":
				m.log.Warn("replication slot is about to be invalidated (wal_status unreserved): the server keeps no more WAL for it than max_slot_wal_keep_size allows; the pipeline must catch up")
			case "lost":
				m.log.Error("replication slot was invalidated (wal_status lost): events may have been missed")
			}
			last = sh.status
		}
		return nil
	})
}

// slotHealth is a measurement of the slot, on the database clock.
type slotHealth struct {
	slot                 string
	exists, active       bool
	status               string
	retained, unconfirmd *float64 // bytes; nil when the server reports NULL
	safe                 *int64
	confirmed            string
	dbNow                time.Time
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func readSlotHealth(ctx context.Context, q queryRower, slot string) (slotHealth, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sh := slotHealth{slot: slot}
	err := q.QueryRow(qctx, `SELECT clock_timestamp(), s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, ''),
			pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::float8,
			pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::float8,
			s.safe_wal_size, coalesce(s.confirmed_flush_lsn::text, '')
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).
		Scan(&sh.dbNow, &sh.exists, &sh.active, &sh.status, &sh.retained, &sh.unconfirmd, &sh.safe, &sh.confirmed)
	return sh, err
}

// health turns a measurement into plugins.Health: the backlog is the WAL
// not confirmed yet; the oldest undelivered event is the first transaction
// read and not confirmed (oldest commit time), when there is one.
func (sh slotHealth) health(oldest time.Time) plugins.Health {
	h := plugins.Health{BacklogUnit: "bytes", CheckedAt: time.Now(), Details: map[string]any{"slot": sh.slot, "slot_exists": sh.exists}}
	if !sh.exists {
		return h
	}
	if sh.unconfirmd != nil {
		h.Backlog = int64(*sh.unconfirmd)
	}
	if !oldest.IsZero() && sh.dbNow.After(oldest) {
		h.OldestAge = sh.dbNow.Sub(oldest)
	}
	h.Details["active"] = sh.active
	h.Details["wal_status"] = sh.status
	h.Details["confirmed_lsn"] = sh.confirmed
	if sh.retained != nil {
		h.Details["retained_wal_bytes"] = int64(*sh.retained)
	}
	if sh.safe != nil {
		h.Details["safe_wal_size_bytes"] = *sh.safe
	}
	return h
}

func (m *slotMetrics) set(sh slotHealth) { m.setSlot(m.slot, sh) }

// setSlot sets the gauges of slot: the pipeline's own, or a split-off
// member's that a shared stream reports (sharedsplit.go).
func (m *slotMetrics) setSlot(slot string, sh slotHealth) {
	if !sh.exists {
		m.active.WithLabelValues(slot).Set(0)
		return
	}
	m.active.WithLabelValues(slot).Set(boolGauge(sh.active))
	if sh.retained != nil {
		m.retained.WithLabelValues(slot).Set(*sh.retained)
	}
	if sh.unconfirmd != nil {
		m.unconfirmed.WithLabelValues(slot).Set(*sh.unconfirmd)
	}
	if sh.safe != nil {
		m.safe.WithLabelValues(slot).Set(float64(*sh.safe))
	} else {
		m.safe.WithLabelValues(slot).Set(-1)
	}
	for _, st := range walStatuses {
		m.status.WithLabelValues(slot, st).Set(boolGauge(st == sh.status))
	}
}

// forget drops slot's series.
func (m *slotMetrics) forget(slot string) {
	for _, c := range m.collectors() {
		c.DeletePartialMatch(prometheus.Labels{"slot": slot})
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
