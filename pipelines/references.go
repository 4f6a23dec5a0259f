package pipelines

import (
	"bytes"
	"maps"
	"slices"

	"gopkg.in/yaml.v3"
)

// SecretReferences is every ${NAME} the YAML documents in data refer to,
// in any scalar, sorted: the names loading them may look up, and so the
// only secrets the converger reads to load a stored pipeline. It may list
// more than loading looks up (a reference in a key, or one with a default
// that is never needed), never less: a reference it missed would leave a
// pipeline unresolved. It stops at a document that does not parse, on
// which loading fails anyway.
func SecretReferences(data []byte) []string {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	names := map[string]bool{}
	for {
		var root yaml.Node
		if dec.Decode(&root) != nil {
			break // io.EOF, or a document loading refuses
		}
		maps.Copy(names, referencedNames(&root))
	}
	return slices.Sorted(maps.Keys(names))
}
