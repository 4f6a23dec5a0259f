package httpapi

import (
	"context"

	"github.com/ferryhq/ferry/plugins"
)

// tenantDial is ctx carrying the dialer of tenant's policy (plugins.WithDial):
// a request that acts for a tenant's pipeline — the connect check, a
// diagnosis, a dead-letter count or replay — opens broker connections of
// its own, and a broker names other hosts once connected (advertised
// listeners, connect_urls); they must pass the policy as the running
// pipeline's do. tenant is "" for the admin's pipelines: ctx unchanged.
func (c *api) tenantDial(ctx context.Context, tenant string) context.Context {
	if tenant == "" || c.o.Control == nil || c.o.Control.Converger == nil {
		return ctx
	}
	return plugins.WithDial(ctx, c.o.Control.Converger.TenantPolicy(tenant).Dialer(tenant))
}

// tenantPipeline is v's tenant when v is a tenant's pipeline (one the API
// manages, with a tenant); "" for the admin's, files included.
func tenantPipeline(v PipelineView) string {
	if v.ManagedBy != managedByAPI {
		return ""
	}
	return v.Tenant
}
