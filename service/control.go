package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/internal/httpapi"
	"github.com/ferryhq/ferry/internal/secretbox"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// controlPlane is a running instance's converger and, with a store, its
// connection to it.
type controlPlane struct {
	store *store.Store // nil without --store
	conv  *Converger
}

// startControl loads the files, opens the store (with one, without
// waiting for it to answer) and converges once: the supervisor is handed its pipelines, and the API its entries,
// the same way with or without a store. The converger is published
// (s.conv) before it first converges: the supervisor's destination check
// reads it as pipelines start.
func (s *Service) startControl(ctx context.Context, sup *engine.Supervisor, coordinationDSN string) (*controlPlane, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.cfg.StoreDSN == "" {
		cv := &Converger{Supervisor: sup, Loader: s.loader, Logger: s.log, LoadFiles: s.loadFiles}
		s.conv.Store(cv)
		if err := cv.Start(ctx); err != nil {
			return nil, err
		}
		return &controlPlane{conv: cv}, nil
	}
	keys, err := secretbox.LoadKeyring(s.cfg.SecretsKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--secrets-key-file: %w", err)
	}
	// Opened without I/O: a store that is down at start does not stop the
	// instance (Converger.Start).
	st, err := store.New(s.cfg.StoreDSN, store.Options{Keyring: keys})
	if err != nil {
		return nil, err
	}
	cv := &Converger{Store: st, Supervisor: sup, Loader: s.loader, Interval: s.cfg.StoreInterval, Logger: s.log,
		Instance: s.cfg.InstanceID, LoadFiles: s.loadFiles, SecretsDir: s.cfg.SecretsDir}
	if coordinationDSN == s.cfg.StoreDSN {
		// The supervisor's status board publishes into the store's
		// ferry_pipeline_status already, every second and with the full
		// status: the converger only reads it (running_on).
		cv.Instance = ""
	}
	// No tenant's pipeline may read Ferry's own databases.
	for _, own := range []struct{ name, dsn string }{{"the store", s.cfg.StoreDSN}, {"the HA coordination database", coordinationDSN}} {
		if own.dsn == "" {
			continue
		}
		r, err := policy.Reserve(own.name, own.dsn)
		if err != nil {
			st.Close()
			return nil, err
		}
		cv.Reserved = append(cv.Reserved, r...)
	}
	s.conv.Store(cv)
	s.metrics.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_store_up",
		Help: "1 while the last read of the control-plane store succeeded, 0 while it fails (the instance runs on its last read)."},
		func() float64 {
			if down, _, _ := cv.StoreDown(); down {
				return 0
			}
			return 1
		}))
	if err := cv.Start(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return &controlPlane{store: st, conv: cv}, nil
}

func (p *controlPlane) close() {
	if p.store != nil {
		p.store.Close()
	}
}

// api is what the HTTP API serves (without a store, the files alone). It
// loads what it is sent as the converger will (Converger.RequestLoader).
func (p *controlPlane) api(s *Service) *httpapi.Control {
	return &httpapi.Control{Store: p.store, Converger: p.conv, Registry: s.registry}
}

// destinations is the supervisor's check of where a pipeline may publish:
// a tenant's store pipeline only where its tenant's policy allows, checked
// per event (its topic may come from row data); the operator's own
// pipelines anywhere.
func (s *Service) destinations(spec *pipelines.Spec) func(string) bool {
	if spec.Tenant == "" || !strings.HasPrefix(spec.File, "store:") {
		return nil
	}
	conv := s.conv.Load()
	if conv == nil {
		return func(string) bool { return false } // no policy known: nothing
	}
	return conv.TenantPolicy(spec.Tenant).AllowsDestination
}
