// Package plugindoc describes every registered component type — its config
// keys, their types, defaults and doc text — for GET /api/v1/plugins and
// the generated component reference, docs/reference. Keys, types and
// defaults come from the typed Config structs by reflection; doc text from
// their doc comments, extracted at build time (go generate) into
// fields.json, which a test keeps equal to the source.
//
// `go generate ./internal/plugindoc` refreshes both: gen writes fields.json,
// then genref renders docs/reference/*.md (package reference) from the
// built-in components (package builtin). Tests fail when either is stale,
// and guard the docs as a whole: every relative link in README.md and
// docs/ resolves, and the README stays a front door of at most 400 lines.
//
// It depends on plugins only; it must not import the components, nor its
// build-time tools (extract, reference, builtin, gen, genref).
package plugindoc

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/plugins"
)

//go:generate go run ./gen ../.. fields.json
//go:generate go run ./genref ../../docs/reference

//go:embed fields.json
var fieldsJSON []byte

var fieldDocs = func() map[string]string {
	m := map[string]string{}
	if err := json.Unmarshal(fieldsJSON, &m); err != nil {
		panic("plugindoc: fields.json: " + err.Error())
	}
	return m
}()

// Field is one config key.
type Field struct {
	Key string `json:"key"`
	// Type is string, boolean, integer, number, duration (Go syntax such
	// as "100ms"), list of T, map of T, or object.
	Type    string `json:"type"`
	Default any    `json:"default,omitempty"`
	Doc     string `json:"doc"`
	// Fields lists the keys of an object, or of each object in a list of
	// object or a map of object.
	Fields []Field `json:"fields,omitempty"`
}

// Plugin is one registered component type.
type Plugin struct {
	Kind   plugins.Kind `json:"kind"`
	Type   string       `json:"type"`
	Fields []Field      `json:"fields"`
}

// Catalog lists every registered type of reg, by kind and name.
func Catalog(reg *plugins.Registry) []Plugin {
	var out []Plugin
	for _, kind := range []plugins.Kind{plugins.KindSource, plugins.KindTransform, plugins.KindSink} {
		for _, name := range reg.Names(kind) {
			f, _ := reg.Lookup(kind, name)
			out = append(out, Plugin{Kind: kind, Type: name, Fields: fields(reflect.ValueOf(f.NewConfig()))})
		}
	}
	return out
}

// Fields describes the keys of a config struct as Catalog describes a
// component's: for the sections of a pipeline that configure Ferry itself
// rather than a component (`canary:`, pipelines.Canary).
func Fields(cfg any) []Field { return fields(reflect.ValueOf(cfg)) }

var durationType = reflect.TypeOf(time.Duration(0))

func fields(v reflect.Value) []Field {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v = reflect.New(v.Type().Elem())
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	t := v.Type()
	var out []Field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if tag == "-" {
			continue
		}
		// An embedded struct, or one tagged inline, puts its keys beside the
		// others, as the YAML decoder does.
		if tag == "" && (sf.Anonymous || slices.Contains(strings.Split(opts, ","), "inline")) {
			out = append(out, fields(v.Field(i))...)
			continue
		}
		if tag == "" {
			continue
		}
		fv := v.Field(i)
		f := Field{Key: tag, Type: typeName(sf.Type), Doc: fieldDocs[t.PkgPath()+"."+t.Name()+"."+sf.Name]}
		switch inner := sf.Type; {
		case structType(inner):
			f.Fields = fields(fv)
		case (inner.Kind() == reflect.Slice || inner.Kind() == reflect.Map) && structType(inner.Elem()):
			// The keys of one item: a zero item, since a default list or
			// map holds none worth describing.
			f.Fields = fields(reflect.New(inner.Elem()).Elem())
		}
		f.Default = defaultOf(fv)
		out = append(out, f)
	}
	return out
}

// structType reports whether t, or what it points to, is a struct of keys
// (a time.Duration is a number, not an object).
func structType(t reflect.Type) bool {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct && t != durationType
}

func typeName(t reflect.Type) string {
	if t == durationType {
		return "duration"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "list of " + typeName(t.Elem())
	case reflect.Map:
		return "map of " + typeName(t.Elem())
	case reflect.Struct:
		return "object"
	}
	return t.Kind().String()
}

// defaultOf is the value a config starts with, as YAML would write it;
// nil for zero values, objects and empty lists (no default worth showing).
func defaultOf(v reflect.Value) any {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.IsZero() {
		return nil
	}
	if v.Type() == durationType {
		return time.Duration(v.Int()).String()
	}
	switch v.Kind() {
	case reflect.Struct:
		return nil
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			return nil
		}
	}
	if v.CanInterface() {
		return v.Interface()
	}
	return fmt.Sprint(v)
}
