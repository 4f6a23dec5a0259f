package pipelines

// ApplyTenantLimits attaches tenant limits defined outside pipeline files
// (the control-plane store) to specs, as `kind: tenant` documents do:
// the limits join the spec's hash, so a change restarts the tenant's
// pipelines, and max_connections is split among them.
func ApplyTenantLimits(specs []*Spec, tenants []*TenantSpec) []*Error {
	return applyTenants(specs, tenants)
}
