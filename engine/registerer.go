package engine

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/pipelines"
)

// metricsFor is what a pipeline's components register their metrics with:
// the supervisor's registry, labelled with the pipeline and its tenant.
func (l *lifecycle) metricsFor(spec *pipelines.Spec) prometheus.Registerer {
	if l.opts.Metrics == nil {
		return prometheus.NewRegistry() // components may register; nobody scrapes
	}
	// Each incarnation registers again: a restarted pipeline takes over its
	// predecessor's collectors.
	return replacingRegisterer{prometheus.WrapRegistererWith(prometheus.Labels{"pipeline": spec.Name, "tenant": spec.Tenant}, l.opts.Metrics)}
}

// replacingRegisterer unregisters an equal collector before registering, so
// a restarted pipeline's components can register the same metrics again.
type replacingRegisterer struct{ prometheus.Registerer }

func (r replacingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		r.Registerer.Unregister(are.ExistingCollector)
		return r.Registerer.Register(c)
	}
	return err
}
