package layout

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// A rule is what one package doc says its package imports, or who imports
// it, made checkable. Paths are relative to the repository, each naming a
// package and every package under it ("." is every Ferry package); a path
// whose first element has a dot is a library's import path.
type rule struct {
	// Pkg is the package whose doc states the rule.
	Pkg string
	// Says is the doc's sentence, quoted: the test fails when the doc no
	// longer says it, so a doc and its rule cannot change apart.
	Says string

	// Only, when set, lists the Ferry packages the package may import
	// itself ("imports only", "imports no other Ferry package": none).
	Only []string
	// Libraries, when set, lists the libraries (neither Ferry's nor the
	// standard library's) it may import itself.
	Libraries []string
	// Deny lists what it must not link, directly or through another
	// package, but for what is in Except.
	Deny, Except []string
	// Importers, when set, lists the only packages that may import it
	// (non-test files); ProductImporters the only product packages that may.
	Importers, ProductImporters []string
	// Lab: no product package may import it (it must be in labs).
	Lab bool

	// Known lists imports that break the rule today and are tolerated
	// until the code is fixed, each with the reason beside it. One that no
	// longer happens fails the test: remove it.
	Known []string
}

// none is an empty list where nil means "not checked".
var none = []string{}

// Kinds of package the docs name.
var (
	components = []string{"sources", "sinks", "transforms"}
	cli        = []string{"cmd"}
	// sourceShared are the packages under sources/ that are not sources:
	// what the sources share.
	sourceShared = []string{"sources/outbox", "sources/window", "sources/backfill", "sources/internal"}
	// databaseTalkers are the packages whose own code talks to a database.
	databaseTalkers = []string{"store", "ownership", "internal/pgddl", "internal/pgcluster", "sources", "github.com/jackc/pgx/v5"}
)

// join concatenates lists of paths.
func join(lists ...[]string) []string { return slices.Concat(lists...) }

// rules holds one rule per package doc that says what its package
// imports; TestEveryImportRuleHasARule keeps it complete.
var rules = []rule{
	{Pkg: "bench", Says: "it imports the product packages it measures and the embedded servers (internal/pgcluster, internal/natsserver), never chaos or a test harness, and no product package may import it",
		Deny: []string{"chaos", "lab", "plugins/plugintest"}, Lab: true},
	{Pkg: "chaos", Says: "it may import product packages and the test harnesses, and no product package may import it",
		Deny: []string{"bench", "cmd/ferry-bench"}, Lab: true},
	{Pkg: "cmd/ferry", Says: "Package main imports only cmd/ferry/cli. The binary must link no lab package (bench, chaos, plugins/plugintest, the test harnesses)",
		Only: []string{"cmd/ferry/cli"}, Deny: labs},
	{Pkg: "cmd/ferry/cli", Says: "It may import any product package but no lab package (bench, chaos, plugins/plugintest, the test harnesses)",
		Deny: labs},
	{Pkg: "cmd/ferry-bench", Says: "Package main may import bench and the product packages; nothing may import it.",
		Deny: []string{"chaos", "lab", "plugins/plugintest"}, Importers: none},
	{Pkg: "console", Says: "It must not import internal/httpapi (which mounts it), anything that talks to a database, or a lab package.",
		Deny: join([]string{"internal/httpapi"}, databaseTalkers, labs),
		// console → engine (for engine.Status and engine.LagSummary) → ownership → internal/pgddl, pgx:
		// the console's own code talks to no database, but it links the engine, which does.
		Known: []string{"ownership", "internal/pgddl", "github.com/jackc/pgx/v5"}},
	{Pkg: "consumer", Says: "whose go.mod requires nothing of Ferry, so a consuming service pulls none of the relay's dependencies. It must not import any other Ferry package: consumers import it alone",
		Only: none, Deny: []string{"."}}, // and its go.mod requires nothing of Ferry: TestConsumerIsItsOwnModule
	{Pkg: "consumer/natsopts", Says: "it imports the consumer package, watermill-nats and nats.go, and nothing of Ferry's relay",
		Only: []string{"consumer"}},
	{Pkg: "consumer/amqpopts", Says: "it imports the consumer package and watermill-amqp, and nothing of Ferry's relay",
		Only: []string{"consumer"}},
	{Pkg: "doctor", Says: "It must not import any component (sources/, transforms/, sinks/), the CLI, the HTTP API or a lab package",
		Deny: join(components, cli, []string{"internal/httpapi"}, labs)},
	{Pkg: "engine", Says: "must not import a concrete component, the CLI, the HTTP API, the store or lab code",
		// service: issue 28's engine imports no service either (which imports it).
		Deny: join(components, cli, []string{"internal/httpapi", "store", "service"}, labs)},
	{Pkg: "internal/demo", Says: "it may import the pipelines and components the demo runs and the embedded servers (internal/pgcluster, internal/natsserver), but no lab package",
		Deny: labs},
	{Pkg: "internal/httpapi", Says: "It reaches components only through plugins and pipelines: it must not import the CLI, a concrete source, sink or transform, or a lab package.",
		Deny: join(cli, components, labs)},
	{Pkg: "internal/layout", Says: "nothing imports it, and it imports nothing",
		Only: none, Libraries: none, Importers: none},
	{Pkg: "internal/migrate", Says: "imports no other Ferry package",
		Only: none},
	{Pkg: "internal/natsserver", Says: "It imports no other Ferry package. Of the product packages only internal/demo may import it",
		Only: none, ProductImporters: []string{"internal/demo"}},
	{Pkg: "internal/pgcluster", Says: "It imports no other Ferry package. Of the product packages only internal/demo may import it",
		Only: none, ProductImporters: []string{"internal/demo"}},
	{Pkg: "internal/brokerconn", Says: "It imports no Ferry package, only Prometheus: the sinks import it, and the service (to export the gauge of open connections); it must not import a sink.",
		Only: none, Libraries: []string{"github.com/prometheus/client_golang"}, Importers: []string{"sinks", "service"}, Deny: []string{"sinks"}},
	{Pkg: "internal/pgddl", Says: "It imports no other Ferry package: ownership, the sources and store (its status table) import it.",
		Only: none, Importers: []string{"ownership", "sources", "store"}},
	{Pkg: "internal/plugindoc", Says: "It depends on plugins only; it must not import the components, nor its build-time tools (extract, reference, builtin, gen, genref).",
		Only: []string{"plugins"}, Deny: join(components, tools)},
	{Pkg: "internal/plugindoc/builtin", Says: "only the reference's generator and its tests import it, never the ferry binary's packages",
		Importers: []string{"internal/plugindoc/genref"}}, // tests are not importers here
	{Pkg: "internal/plugindoc/extract", Says: "product code must not import it, and it imports no other Ferry package",
		Only: none, ProductImporters: none},
	{Pkg: "internal/plugindoc/gen", Says: "It imports only internal/plugindoc/extract; nothing imports it.",
		Only: []string{"internal/plugindoc/extract"}, Importers: none},
	{Pkg: "internal/plugindoc/genref", Says: "nothing imports it.",
		Importers: none},
	{Pkg: "internal/plugindoc/reference", Says: "It imports internal/plugindoc, plugins and the pipeline model (for the pipeline's own sections) only, never a component",
		Only: []string{"internal/plugindoc", "plugins", "pipelines"}, Deny: components},
	{Pkg: "internal/redact", Says: "It imports no other Ferry package",
		Only: none},
	{Pkg: "internal/retry", Says: "It imports only the backoff library; it must not import plugins, sources, sinks or transforms.",
		Only: none, Libraries: []string{"github.com/cenkalti/backoff"}, Deny: join([]string{"plugins"}, components)},
	{Pkg: "internal/secretbox", Says: "It is pure cryptography over the standard library: it must not import any Ferry package",
		Only: none, Libraries: none},
	{Pkg: "internal/tlsconf", Says: "It imports only plugins (for its problem list): the sinks import it, and it must not import a sink.",
		Only: []string{"plugins"}, Importers: []string{"sinks"}, Deny: []string{"sinks"}},
	{Pkg: "lab/consumertest", Says: "It is lab code with no code of its own, only tests: nothing imports it, and its package imports nothing.",
		Lab: true, Only: none, Libraries: none, Importers: none},
	{Pkg: "lab/fakenats", Says: "It is lab code: only tests import it, and it imports no Ferry package.",
		Lab: true, Only: none, Importers: labs},
	{Pkg: "lab/faultproxy", Says: "It is lab code: only tests import it, and it imports no Ferry package.",
		Lab: true, Only: none, Importers: labs}, // tests: the suites and harnesses
	{Pkg: "lab/relaytest", Says: "It is lab code: no product package imports it.",
		Lab: true},
	{Pkg: "lab/testenv", Says: "no product package does (internal/layout's test checks it), and it imports no Ferry package but the throwaway-PostgreSQL and in-process NATS helpers",
		Lab: true, Only: []string{"internal/pgcluster", "internal/natsserver"}},
	{Pkg: "ownership", Says: "It must not import pipelines (which imports it), a component or a lab package: of Ferry it needs only internal/pgddl.",
		Only: []string{"internal/pgddl"}, Deny: join([]string{"pipelines"}, components, labs)},
	{Pkg: "pipelines", Says: "must not import the engine, any component (sources/, transforms/, sinks/: binaries register them), the CLI, the HTTP API or the console, nor lab code (bench, chaos, test harnesses)",
		Deny: join([]string{"engine"}, components, cli, []string{"internal/httpapi", "console"}, labs)},
	{Pkg: "pipelines/examples", Says: "It embeds files and imports no Go package of Ferry.",
		Only: none},
	{Pkg: "plugins", Says: "It must not import any Ferry package",
		Only: none, Deny: []string{"."}},
	{Pkg: "plugins/examples/redact", Says: "It imports only Ferry's plugins package and Watermill",
		Only: []string{"plugins"}, Libraries: []string{"github.com/ThreeDotsLabs/watermill"}},
	{Pkg: "plugins/examples/redisstream", Says: "It imports only Ferry's plugins package, Watermill and the Redis client",
		Only: []string{"plugins"}, Libraries: []string{"github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill-redisstream", "github.com/redis/go-redis"}},
	{Pkg: "plugins/examples/redisstream/cmd/ferry-redis", Says: "It imports only service and the sink",
		Only: []string{"service", "plugins", "plugins/examples/redisstream"}, Deny: []string{"cmd"}},
	{Pkg: "plugins/plugintest", Says: "the xid8 source and the lab's test environment; never a sink.",
		Deny: []string{"sinks"}},
	{Pkg: "policy", Says: "must not import the store, the HTTP API, the CLI, a concrete component or lab code",
		Deny: join([]string{"store", "internal/httpapi"}, cli, components, labs)},
	{Pkg: "sinks/format", Says: "must not import a sink, a source, the pipelines package or a lab package",
		Deny: join([]string{"sinks", "sources", "pipelines"}, labs)},
	{Pkg: "sinks/kafka", Says: "A sink imports plugins, sinks/format and the internal helpers (redact, tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.",
		Deny: join([]string{"sinks", "sources", "pipelines"}, labs), Except: []string{"sinks/format"}},
	{Pkg: "sinks/nats", Says: "A sink imports plugins, sinks/format and the internal helpers (redact, tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.",
		Deny: join([]string{"sinks", "sources", "pipelines"}, labs), Except: []string{"sinks/format"}},
	{Pkg: "sinks/rabbitmq", Says: "A sink imports plugins, sinks/format and the internal helpers (redact, tlsconf, brokerconn), never another sink, a source, pipelines or a lab package.",
		Deny: join([]string{"sinks", "sources", "pipelines"}, labs), Except: []string{"sinks/format"}},
	{Pkg: "sources/backfill", Says: "never a source.",
		Deny: []string{"sources"}, Except: sourceShared},
	{Pkg: "sources/internal/pgsource", Says: "it must not import a source package, a sink, a transform or pipelines. Being internal to sources/, nothing outside sources/ can import it.",
		Deny: []string{"sources", "sinks", "transforms", "pipelines"}, Except: sourceShared, Importers: []string{"sources"}},
	{Pkg: "sources/outbox", Says: "It may import plugins; it must not import a source, a sink, a transform, pipelines or sources/internal.",
		Deny: []string{"sources", "sinks", "transforms", "pipelines"}, Except: []string{"sources/window", "sources/backfill"}},
	{Pkg: "sources/poll", Says: "It must not import another source, a sink, a transform or pipelines.",
		Deny: []string{"sources", "sinks", "transforms", "pipelines"}, Except: sourceShared},
	{Pkg: "sources/wal", Says: "it must not import another source, a sink, a transform or pipelines.",
		Deny: []string{"sources", "sinks", "transforms", "pipelines"}, Except: sourceShared},
	{Pkg: "sources/watermillsql", Says: "It imports no sink or transform.",
		Deny: []string{"sinks", "transforms"}},
	{Pkg: "sources/window", Says: "It imports no Ferry package, only Watermill's message: sources import it, never the other way round.",
		Only: none, Libraries: []string{"github.com/ThreeDotsLabs/watermill/message"}, Importers: []string{"sources"}},
	{Pkg: "sources/xid8", Says: "It must not import another source, a sink, a transform or pipelines.",
		Deny: []string{"sources", "sinks", "transforms", "pipelines"}, Except: sourceShared},
	{Pkg: "store", Says: "it must not import any of them, nor engine, a source, a sink or a lab package: of Ferry it needs only pipelines (to check a pipeline's YAML), policy (the type of a tenant's policy), plugins (its error type), internal/secretbox, internal/redact and internal/pgddl (the status table where it is not a store).",
		Deny: join(cli, []string{"internal/httpapi", "service", "engine", "sources", "sinks"}, labs),
		Only: []string{"pipelines", "policy", "plugins", "internal/secretbox", "internal/redact", "internal/pgddl"}},
	{Pkg: "tracing", Says: "it must not import a source, a sink, the pipelines package (which imports it) or a lab package.",
		Deny: join([]string{"sources", "sinks", "pipelines"}, labs)},
	{Pkg: "engine/canary", Says: "It imports the model (pipelines) and plugins, never a component",
		Only: []string{"pipelines", "plugins", "internal/redact", "internal/retry"}, Deny: components},
	{Pkg: "service", Says: "It must not import cmd/ferry/cli or any other cmd/ package",
		Deny: join(cli, labs)},
	{Pkg: "transforms/filter", Says: "A transform imports plugins only (and the transforms' expression meter), never pipelines, a source, a sink, another transform or a lab package.",
		Only: []string{"plugins", "transforms/internal/expression"}, Deny: join([]string{"pipelines"}, components, labs), Except: []string{"transforms/internal"}},
	{Pkg: "transforms/internal/expression", Says: "A component imports it; it imports nothing of Ferry.",
		Only: none},
	{Pkg: "transforms/headers", Says: "A transform imports plugins only, never pipelines, a source, a sink, another transform or a lab package.",
		Only: []string{"plugins"}, Deny: join([]string{"pipelines"}, components, labs)},
	{Pkg: "transforms/router", Says: "A transform imports plugins only, never pipelines, a source, a sink, another transform or a lab package.",
		Only: []string{"plugins"}, Deny: join([]string{"pipelines"}, components, labs)},
}

// componentHelpers are the internal packages a component may import: each
// imports nothing of Ferry but plugins.
var componentHelpers = []string{"internal/redact", "internal/retry", "internal/tlsconf", "internal/pgddl", "internal/brokerconn"}

// isLibrary reports whether pattern names a library, not a Ferry path.
func isLibrary(pattern string) bool {
	first, _, _ := strings.Cut(pattern, "/")
	return strings.Contains(first, ".")
}

// isStandard reports whether an import path is the standard library's.
func isStandard(path string) bool { return !isLibrary(path) }

// matches reports which of patterns the import path falls under.
func matches(path string, patterns []string) (string, bool) {
	r := rel(path)
	for _, p := range patterns {
		if isLibrary(p) {
			if path == p || strings.HasPrefix(path, p+"/") {
				return p, true
			}
		} else if r != "" && under(r, []string{p}) {
			return p, true
		}
	}
	return "", false
}

// importersOf is, for each Ferry package, the packages whose non-test files
// import it.
func importersOf(pkgs map[string]*pkg) map[string][]string {
	by := map[string][]string{}
	for _, path := range sorted(pkgs) {
		for _, imp := range pkgs[path].Imports {
			if r := rel(imp); r != "" {
				by[r] = append(by[r], rel(path))
			}
		}
	}
	return by
}

// TestPackageDocRules checks each rule against `go list`: what the package
// imports (Only, Libraries), what it links (Deny, transitively, naming the
// chain), and who imports it.
func TestPackageDocRules(t *testing.T) {
	pkgs := listPackages(t)
	importers := importersOf(pkgs)
	seen := map[string]bool{}
	for _, r := range rules {
		t.Run(r.Pkg, func(t *testing.T) {
			if seen[r.Pkg] {
				t.Fatalf("two rules for %s: make them one", r.Pkg)
			}
			seen[r.Pkg] = true
			path := module + "/" + r.Pkg
			p := pkgs[path]
			if p == nil {
				t.Fatalf("no package %s: remove its rule", r.Pkg)
			}
			if says := collapse(r.Says); !strings.Contains(p.doc, says) {
				t.Errorf("the package doc of %s no longer says %q: make its rule say what the doc says now", r.Pkg, says)
			}
			if r.Only == nil && r.Libraries == nil && r.Deny == nil && r.Importers == nil && r.ProductImporters == nil && !r.Lab {
				t.Fatalf("the rule for %s checks nothing", r.Pkg)
			}
			known := map[string]bool{}
			broken := func(dep, format string, args ...any) {
				t.Helper()
				if k, ok := matches(dep, r.Known); ok {
					known[k] = true
					return
				}
				t.Errorf("%s: "+format+"; its doc: %q", append(append([]any{r.Pkg}, args...), r.Says)...)
			}
			for _, imp := range p.Imports {
				switch d := rel(imp); {
				case d != "" && r.Only != nil && !under(d, r.Only):
					broken(imp, "imports %s, which is not among %v", d, r.Only)
				case d == "" && !isStandard(imp) && r.Libraries != nil:
					if _, ok := matches(imp, r.Libraries); !ok {
						broken(imp, "imports the library %s, which is not among %v", imp, r.Libraries)
					}
				}
			}
			// One report per denied path: the dep that names it, else the
			// first Ferry package under it, else the first library package.
			worst := map[string]string{}
			var denied []string
			for _, dep := range p.Deps {
				d, ok := matches(dep, r.Deny)
				if _, except := matches(dep, r.Except); !ok || except || dep == path {
					continue
				}
				if prev, seen := worst[d]; !seen {
					denied = append(denied, d)
					worst[d] = dep
				} else if dep == d || module+"/"+d == dep || rel(prev) == "" && rel(dep) != "" {
					worst[d] = dep
				}
			}
			for _, d := range denied {
				dep := worst[d]
				broken(dep, "links %s (%s): %s", name(dep), d, chain(pkgs, path, dep))
			}
			for _, imp := range importers[r.Pkg] {
				if r.Importers != nil && !under(imp, r.Importers) {
					t.Errorf("%s is imported by %s, which is not among %v; its doc: %q", r.Pkg, imp, r.Importers, r.Says)
				}
				if r.ProductImporters != nil && isProduct(imp) && !under(imp, r.ProductImporters) {
					t.Errorf("%s is imported by the product package %s, which is not among %v; its doc: %q", r.Pkg, imp, r.ProductImporters, r.Says)
				}
			}
			if r.Lab && !under(r.Pkg, labs) {
				t.Errorf("%s's doc says no product package may import it, but it is not in labs (layout_test.go)", r.Pkg)
			}
			for _, k := range r.Known {
				if !known[k] {
					t.Errorf("%s no longer breaks its rule through %s: remove it from the rule's Known", r.Pkg, k)
				}
			}
		})
	}
}

// importRule finds a package doc's statement of what it imports or who
// imports it ("must not import", "imports only", "nothing imports it", …).
var importRule = regexp.MustCompile(`(?i)\bimport(s|ed)?\b`)

// TestEveryImportRuleHasARule fails for a package whose doc says what it
// imports, or who may import it, and has no rule in the table: a rule
// stated in prose only is a rule nobody checks.
func TestEveryImportRuleHasARule(t *testing.T) {
	pkgs := listPackages(t)
	has := map[string]bool{}
	for _, r := range rules {
		has[r.Pkg] = true
	}
	var stated int
	for _, path := range sorted(pkgs) {
		r, doc := rel(path), pkgs[path].doc
		loc := importRule.FindStringIndex(doc)
		if loc == nil {
			continue
		}
		stated++
		if !has[r] {
			from, to := max(loc[0]-60, 0), min(loc[1]+60, len(doc))
			t.Errorf("the package doc of %s says what it imports (…%s…) but has no rule: add one to rules (rules_test.go)", r, doc[from:to])
		}
	}
	if stated < len(rules) {
		t.Fatalf("%d package docs state an import rule, fewer than the %d rules", stated, len(rules))
	}
}

// TestComponentsImportPluginsAndTheirOwn: a component — a package under
// sources/, sinks/ or transforms/ — links, of Ferry, only plugins, packages
// of its own kind (sources/… for a source) and the internal helpers that
// import nothing of Ferry but plugins (componentHelpers). So a component is
// built as a custom one is, against the plugins API, and never reaches the
// engine, the model, the control plane or a lab (DESIGN.md "Components and
// registration").
func TestComponentsImportPluginsAndTheirOwn(t *testing.T) {
	pkgs := listPackages(t)
	var checked int
	for _, path := range sorted(pkgs) {
		r := rel(path)
		if !under(r, components) {
			continue
		}
		checked++
		kind, _, _ := strings.Cut(r, "/")
		allowed := join([]string{"plugins", kind}, componentHelpers)
		for _, dep := range pkgs[path].Deps {
			if d := rel(dep); d != "" && !under(d, allowed) {
				t.Errorf("component %s links %s, which is none of %v: %s", r, d, allowed, chain(pkgs, path, dep))
			}
		}
	}
	for _, h := range componentHelpers {
		p := pkgs[module+"/"+h]
		if p == nil {
			t.Errorf("no package %s: remove it from componentHelpers", h)
			continue
		}
		for _, imp := range p.Imports {
			if d := rel(imp); d != "" && d != "plugins" {
				t.Errorf("component helper %s imports %s: a helper imports nothing of Ferry but plugins", h, d)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d component packages", checked)
	}
}
