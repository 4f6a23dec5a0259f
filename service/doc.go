// Package service is the embeddable Ferry relay: everything `ferry run`
// does, as a Go value. A program builds a Config, calls New with the
// registry its components are in, and runs it:
//
//	svc, err := service.New(service.Config{Files: []string{"pipelines/"}, HTTPAddr: ":8080"}, plugins.Default)
//	if err != nil { … }
//	err = svc.Run(ctx) // until ctx ends
//
// or, for a ferry binary with components of its own, hands main to it:
//
//	func main() { os.Exit(service.Main(plugins.Default)) }
//
// It owns the wiring of one instance: loading the pipeline files, the
// engine's supervisor with high availability and the tenants' destination
// restriction, the control-plane store and the Converger that makes the
// supervisor match it (the paused pipelines included), the reserved
// databases no tenant may read, the HTTP API with the console and the
// metrics, life through a store outage (an instance starts without its
// store, runs its files, and converges when the store answers:
// converge_store.go), reloads (Reload, POST /api/v1/reload, Config.Watch; Main adds
// SIGHUP), and the process's signals when it is a process's main. The
// built-in sources, sinks and transforms register themselves in
// plugins.Default when this package is linked.
//
// It must not import cmd/ferry/cli or any other cmd/ package (the CLI is a
// thin command over it, not the other way round), nor a lab package
// (bench, chaos, plugins/plugintest, lab/); internal/layout's test checks
// both.
package service
