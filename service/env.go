package service

import (
	"fmt"
	"os"
	"strings"
)

// clearLibpqEnvironment removes the variables pgx, like libpq, takes
// defaults from (PGPASSWORD, PGPORT, PGSERVICE, PGSSLCERT, …), and points
// the password and service files at nothing: a tenant's DSN without a
// password would otherwise send this server's password, from the
// environment or ~/.pgpass, to whatever host the tenant named. It returns
// the names it cleared. It changes the whole process's environment: Run
// calls it when there is a store, that is when tenants write DSNs.
func clearLibpqEnvironment() []string {
	var cleared []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") {
			os.Unsetenv(name)
			cleared = append(cleared, name)
		}
	}
	// Without these, pgx reads ~/.pgpass and ~/.pg_service.conf.
	os.Setenv("PGPASSFILE", os.DevNull)
	os.Setenv("PGSERVICEFILE", os.DevNull)
	return cleared
}

// tokens are the bearer tokens the API is served with.
type tokens struct{ admin, metrics string }

// readTokens reads the token files, or takes the tokens as given.
func (c Config) readTokens() (tokens, error) {
	t := tokens{admin: c.AdminToken, metrics: c.MetricsToken}
	var err error
	if c.AdminTokenFile != "" {
		if t.admin, err = readTokenFile("--admin-token-file", c.AdminTokenFile); err != nil {
			return t, &UsageError{Err: err}
		}
	}
	if c.MetricsTokenFile != "" {
		if t.metrics, err = readTokenFile("--metrics-token-file", c.MetricsTokenFile); err != nil {
			return t, &UsageError{Err: err}
		}
	}
	return t, nil
}

// readTokenFile reads a token from the file a flag names.
func readTokenFile(flag, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, file)
	}
	return t, nil
}
