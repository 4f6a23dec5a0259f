package kafka

import "github.com/ferryhq/ferry/internal/tlsconf"

// TLSConfig is the `tls:` block (see internal/tlsconf): the CAs that verify
// the broker, an optional client certificate, the name to verify.
type TLSConfig = tlsconf.Config
