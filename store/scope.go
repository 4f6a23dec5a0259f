package store

import (
	"fmt"
	"regexp"
	"strings"
)

// Scope is what a token may do: "admin"; "tenant:<name>" (read and write
// that tenant's pipelines and limits); "read:<name>" (read that tenant's);
// "read" (read everything but the audit log).
type Scope string

// Scope kinds.
const (
	ScopeAdmin = Scope("admin")
	ScopeRead  = Scope("read")
)

// tenantNameRule says what tenantName accepts, for error messages.
const tenantNameRule = "a tenant name is lowercase letters, digits, _ or -, starting with a letter, at most 48 long"

var tenantName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,47}$`)

// ParseScope checks a scope's syntax.
func ParseScope(s string) (Scope, error) {
	switch {
	case s == string(ScopeAdmin), s == string(ScopeRead):
		return Scope(s), nil
	case strings.HasPrefix(s, "tenant:") && tenantName.MatchString(strings.TrimPrefix(s, "tenant:")),
		strings.HasPrefix(s, "read:") && tenantName.MatchString(strings.TrimPrefix(s, "read:")):
		return Scope(s), nil
	}
	return "", fmt.Errorf("scope %q: want admin, read, tenant:<name> or read:<name>", s)
}

// Tenant is the tenant a tenant:<name> or read:<name> scope is bound to;
// empty for admin and read.
func (s Scope) Tenant() string {
	_, t, _ := strings.Cut(string(s), ":")
	return t
}

// CanWrite reports whether the scope may change anything at all.
func (s Scope) CanWrite() bool { return s == ScopeAdmin || strings.HasPrefix(string(s), "tenant:") }

// CanSeeTenant reports whether the scope may read the tenant's resources.
func (s Scope) CanSeeTenant(tenant string) bool {
	if s == ScopeAdmin || s == ScopeRead {
		return true
	}
	return s.Tenant() == tenant
}

// CanWriteTenant reports whether the scope may change the tenant's
// resources.
func (s Scope) CanWriteTenant(tenant string) bool {
	if s == ScopeAdmin {
		return true
	}
	return strings.HasPrefix(string(s), "tenant:") && s.Tenant() == tenant
}
