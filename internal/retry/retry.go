// Package retry owns how Ferry spaces the retries of a dependency that keeps
// failing (a database, a broker read): one backoff policy, so every retrying
// loop of the process behaves alike. It imports only the backoff library;
// it must not import plugins, sources, sinks or transforms.
package retry

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff is the retry spacing: 200ms growing to a minute, jittered, so
// many pipelines hitting one restarting database or broker do not retry in
// lockstep.
func Backoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = time.Minute
	return bo
}
