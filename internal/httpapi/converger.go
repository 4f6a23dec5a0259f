package httpapi

import (
	"context"
	"time"

	"github.com/ferryhq/ferry/engine"
	"github.com/ferryhq/ferry/pipelines"
	"github.com/ferryhq/ferry/policy"
	"github.com/ferryhq/ferry/store"
)

// Converger is what the control plane needs of the instance's converger
// (service.Converger, which makes the supervisor match the store). Its
// methods are safe for concurrent use.
type Converger interface {
	// Snapshot is the store as last read, and what the instance made of it.
	Snapshot() store.Snapshot
	// Changed asks for a convergence soon, after a write.
	Changed()
	// Converge reads the store and makes the supervisor match it now.
	Converge(ctx context.Context) (engine.ReloadResult, error)
	// CheckPolicy judges a submitted pipeline against its tenant's policy
	// as the converger will.
	CheckPolicy(ctx context.Context, spec *pipelines.Spec, createdAt time.Time) []*pipelines.Error
	// TenantPolicy is a tenant's policy as last read.
	TenantPolicy(tenant string) policy.Policy
	// RequestLoader loads what the API is sent as the converger will load
	// it from the store.
	RequestLoader() pipelines.Loader
}
