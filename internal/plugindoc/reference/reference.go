// Package reference renders the component reference, docs/reference/*.md:
// every registered source, transform and sink with each key's type, default
// and doc text — the catalog GET /api/v1/plugins serves (plugindoc.Catalog)
// — and an example pipeline. `go generate ./internal/plugindoc` writes the
// pages (command genref); a test fails when the committed pages differ.
//
// It imports internal/plugindoc, plugins and the pipeline model (for the
// pipeline's own sections) only, never a component: the caller hands it the
// registry (genref uses package builtin's).
package reference

import (
	"bytes"
	"embed"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/ferryhq/ferry/internal/plugindoc"
	"github.com/ferryhq/ferry/plugins"
)

// Command is what regenerates the pages; stale-page errors name it.
const Command = "go generate ./internal/plugindoc"

// Examples holds one example pipeline per built-in component,
// examples/<kind>s/<type>.yaml; a test loads each as `ferry validate` does.
//
//go:embed examples
var Examples embed.FS

// ExamplePath is where the example of a component lives in Examples.
func ExamplePath(kind plugins.Kind, typ string) string {
	return "examples/" + string(kind) + "s/" + typ + ".yaml"
}

// SectionExamplePath is where the example of a pipeline section lives in
// Examples.
func SectionExamplePath(key string) string { return "examples/pipeline/" + key + ".yaml" }

// kinds are the pages, in the order the index lists them.
var kinds = []struct {
	kind         plugins.Kind
	file, title  string
	where        string // where in a pipeline file the component's keys sit
	guide, about string
}{
	{plugins.KindSource, "sources.md", "Sources", "its `source:` section", "../sources.md",
		"read committed outbox rows and turn each into an event"},
	{plugins.KindTransform, "transforms.md", "Transforms", "its item of the `transforms:` list", "../transforms.md",
		"change, route, drop or stamp each event between the source and the sink"},
	{plugins.KindSink, "sinks.md", "Sinks", "its `sink:` section", "../sinks.md",
		"publish each event and return only once the broker confirmed it"},
}

// Pages renders the reference of every component in reg: file name →
// content, one page per kind and an index (README.md).
func Pages(reg *plugins.Registry) map[string][]byte {
	byKind := map[plugins.Kind][]plugindoc.Plugin{}
	for _, p := range plugindoc.Catalog(reg) {
		byKind[p.Kind] = append(byKind[p.Kind], p)
	}
	pages := map[string][]byte{}
	var index bytes.Buffer
	header(&index, "Component reference")
	fmt.Fprintf(&index, "Every source, transform and sink built into `ferry`: each key of its section of a pipeline\n"+
		"file, the key's type, its default and what it does, and an example pipeline. The pages are\n"+
		"generated from the components' typed `Config` structs and their doc comments — the same text\n"+
		"`GET /api/v1/plugins` serves — by `%s`; a test fails when they are stale.\n"+
		"How the pipeline file around them works: [Pipelines](../pipelines.md).\n", Command)
	for _, k := range kinds {
		fmt.Fprintf(&index, "\n## [%s](%s)\n\n%s %s.\n\n", k.title, k.file, k.title, k.about)
		for _, p := range byKind[k.kind] {
			fmt.Fprintf(&index, "- [`%s`](%s#%s)%s\n", p.Type, k.file, p.Type, summarySuffix(k.kind, p.Type))
		}
		var b bytes.Buffer
		header(&b, k.title)
		fmt.Fprintf(&b, "Every %s type built into `ferry`: the keys of %s besides `type:`, each\n"+
			"with its type, its default and its doc text, and an example pipeline. How %s behave, and\n"+
			"when to use which: [the %s guide](%s). All components: [the reference](README.md).\n\n",
			k.kind, k.where, strings.ToLower(k.title), strings.ToLower(k.title), k.guide)
		for _, p := range byKind[k.kind] {
			fmt.Fprintf(&b, "- [`%s`](#%s)%s\n", p.Type, p.Type, summarySuffix(k.kind, p.Type))
		}
		for _, p := range byKind[k.kind] {
			component(&b, p)
		}
		pages[k.file] = b.Bytes()
	}
	fmt.Fprintf(&index, "\n## [Pipeline sections](%s)\n\nSections of a pipeline file that configure Ferry itself, not a component.\n\n", sectionsFile)
	for _, sec := range Sections {
		fmt.Fprintf(&index, "- [`%s:`](%s#%s) — %s\n", sec.Key, sectionsFile, sec.Key, sec.Summary)
	}
	pages[sectionsFile] = sectionsPage()
	pages["README.md"] = index.Bytes()
	return pages
}

// sectionsFile is the page of the pipeline's own sections.
const sectionsFile = "pipeline.md"

// sectionsPage renders Sections: each key with its type, default and doc
// text, and an example pipeline.
func sectionsPage() []byte {
	var b bytes.Buffer
	header(&b, "Pipeline sections")
	b.WriteString("The sections of a pipeline file that configure a feature of Ferry itself rather than a\n" +
		"component: each key with its type, its default and its doc text, and an example pipeline.\n" +
		"The rest of the file: [Pipelines](../pipelines.md). All components: [the reference](README.md).\n\n")
	for _, sec := range Sections {
		fmt.Fprintf(&b, "- [`%s:`](#%s) — %s\n", sec.Key, sec.Key, sec.Summary)
	}
	for _, sec := range Sections {
		fmt.Fprintf(&b, "\n## `%s`\n\n", sec.Key)
		fmt.Fprintf(&b, "%s. How it behaves: [%s](%s).\n\n", capitalize(sec.Summary), sec.GuideTitle, sec.Guide)
		b.WriteString("| key | type | default | what it does |\n|---|---|---|---|\n")
		rows(&b, "", plugindoc.Fields(sec.Config))
		if ex, err := Examples.ReadFile(SectionExamplePath(sec.Key)); err == nil {
			fmt.Fprintf(&b, "\nExample:\n\n```yaml\n%s```\n", ex)
		}
	}
	return b.Bytes()
}

func header(b *bytes.Buffer, title string) {
	fmt.Fprintf(b, "# %s\n\n<!-- Code generated by %s from the components' config structs; DO NOT EDIT. -->\n\n", title, Command)
}

func summarySuffix(kind plugins.Kind, typ string) string {
	if a, ok := About[string(kind)+"/"+typ]; ok {
		return " — " + a.Summary
	}
	return ""
}

func component(b *bytes.Buffer, p plugindoc.Plugin) {
	fmt.Fprintf(b, "\n## `%s`\n\n", p.Type)
	if a, ok := About[string(p.Kind)+"/"+p.Type]; ok {
		fmt.Fprintf(b, "%s. How it behaves: [%s](%s).\n\n", capitalize(a.Summary), a.GuideTitle, a.Guide)
	}
	b.WriteString("| key | type | default | what it does |\n|---|---|---|---|\n")
	rows(b, "", p.Fields)
	if ex, err := Examples.ReadFile(ExamplePath(p.Kind, p.Type)); err == nil {
		fmt.Fprintf(b, "\nExample:\n\n```yaml\n%s```\n", ex)
	}
}

// rows writes one table row per key, nested keys by their dotted path
// (`columns.id`; `fields[].column` for the keys of a list's items).
func rows(b *bytes.Buffer, prefix string, fields []plugindoc.Field) {
	for _, f := range fields {
		key := prefix + f.Key
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", key, f.Type, defaultCell(f.Default), cell(f.Doc))
		if len(f.Fields) == 0 {
			continue
		}
		switch {
		case strings.HasPrefix(f.Type, "list of "):
			rows(b, key+"[].", f.Fields)
		case strings.HasPrefix(f.Type, "map of "):
			rows(b, key+".*.", f.Fields)
		default:
			rows(b, key+".", f.Fields)
		}
	}
}

// defaultCell writes a default as YAML would hold it; durations in their
// short form (1m, not 1m0s).
func defaultCell(v any) string {
	if v == nil {
		return ""
	}
	return "`" + strings.ReplaceAll(yamlValue(reflect.ValueOf(v)), "|", `\|`) + "`"
}

func yamlValue(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		items := make([]string, v.Len())
		for i := range items {
			items[i] = yamlValue(v.Index(i))
		}
		return "[" + strings.Join(items, ", ") + "]"
	case reflect.Map:
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		items := make([]string, len(keys))
		for i, k := range keys {
			items[i] = yamlValue(k) + ": " + yamlValue(v.MapIndex(k))
		}
		return "{" + strings.Join(items, ", ") + "}"
	case reflect.String:
		if d, err := time.ParseDuration(v.String()); err == nil && v.String() == d.String() {
			return shortDuration(d)
		}
	}
	return fmt.Sprint(v.Interface())
}

// shortDuration drops the zero units time.Duration.String keeps: 1m0s → 1m.
func shortDuration(d time.Duration) string {
	s := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if strings.HasSuffix(s, "m"+zero) || strings.HasSuffix(s, "h"+zero) {
			s = strings.TrimSuffix(s, zero)
		}
	}
	return s
}

// cell makes doc text safe in a table cell: a | ends a cell, and outside
// code spans a <word> would be read as HTML.
func cell(doc string) string {
	if doc == "" {
		return "—"
	}
	var b strings.Builder
	code := false
	for _, r := range doc {
		switch {
		case r == '`':
			code = !code
			b.WriteRune(r)
		case r == '|':
			b.WriteString(`\|`)
		case r == '<' && !code:
			b.WriteString("&lt;")
		case r == '>' && !code:
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
