// Package tlsconf is the `tls:` block every sink shares: the CAs that verify
// the broker, an optional client certificate for mutual TLS, and the name to
// verify.
//
// It imports only plugins (for its problem list): the sinks import it, and it
// must not import a sink.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/ferryhq/ferry/plugins"
)

// Config is the `tls:` block: how Ferry verifies the servers and, for
// mutual TLS, proves who it is.
type Config struct {
	// Enabled turns TLS on. Default false.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs that sign the servers' certificates.
	// Default: the system's roots.
	CAFile string `yaml:"ca_file" ferry:"file"`
	// CertFile is Ferry's PEM client certificate, for mutual TLS; needs
	// key_file. Default none.
	CertFile string `yaml:"cert_file" ferry:"file"`
	// KeyFile is the PEM private key of cert_file. Default none.
	KeyFile string `yaml:"key_file" ferry:"file"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	// Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
	// ServerName is the name the server certificates must carry. Default:
	// the host Ferry dials.
	ServerName string `yaml:"server_name"`
}

// Validate reports every problem with paths relative to the block.
func (c Config) Validate() error {
	var p plugins.Problems
	if !c.Enabled {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.InsecureSkipVerify || c.ServerName != "" {
			p.Add("enabled", "must be true when other tls settings are given")
		}
		return p.Err()
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		p.Add("cert_file", "cert_file and key_file go together")
	}
	for _, f := range []struct{ key, path string }{{"ca_file", c.CAFile}, {"cert_file", c.CertFile}, {"key_file", c.KeyFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			p.Add(f.key, "cannot read %s: %v", f.path, errors.Unwrap(err))
		}
	}
	return p.Err()
}

// Build loads the files and returns the client TLS config, or nil when TLS
// is off.
func (c Config) Build() (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // the user's explicit choice, documented as test-only
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file: no PEM certificate in %s", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
