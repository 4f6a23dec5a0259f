package policy

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// fileFields lists the YAML paths of the non-empty string fields of cfg
// tagged `ferry:"file"` (a TLS CA, certificate or key, NATS credentials):
// each names a file on the relay's machine. It follows the YAML layout:
// nested structs, pointers, slices ("key[0]"), string-keyed maps
// ("key.name") and inline structs.
func fileFields(cfg any) []string {
	var out []string
	walkFiles(reflect.ValueOf(cfg), "", &out)
	return out
}

func walkFiles(v reflect.Value, path string, out *[]string) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" {
				continue
			}
			p := path
			if !slices.Contains(strings.Split(opts, ","), "inline") {
				if name == "" {
					name = strings.ToLower(f.Name) // yaml.v3's default key
				}
				p = join(path, name)
			}
			fv := v.Field(i)
			if slices.Contains(strings.Split(f.Tag.Get("ferry"), ","), "file") {
				fileValues(fv, p, out)
				continue
			}
			walkFiles(fv, p, out)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkFiles(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return
		}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			walkFiles(v.MapIndex(k), join(path, k.String()), out)
		}
	}
}

// fileValues adds path for a non-empty string, or path[i] for each
// non-empty string of a list: the value of a field tagged `ferry:"file"`.
func fileValues(v reflect.Value, path string, out *[]string) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() != "" {
			*out = append(*out, path)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			fileValues(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}
