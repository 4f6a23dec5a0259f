package httpapi

// ControlRoutes lists the control plane's routes as mux patterns.
func ControlRoutes() []string {
	var out []string
	for _, r := range (&api{}).controlRoutes() {
		out = append(out, r.method+" /api/v1"+r.path)
	}
	return out
}
