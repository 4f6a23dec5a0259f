package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// Canonical returns the canonical form of a one-document pipeline text and
// its SHA-256: comments, quoting and flow or block style do not count, so
// re-submitting a reformatted file changes nothing. ${VAR} references stay
// as written.
func Canonical(text []byte) (canonical []byte, sum string, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, "", errors.New("empty document")
		}
		return nil, "", err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, "", err
		}
		return nil, "", fmt.Errorf("line %d: one pipeline per request (this body holds several documents)", extra.Line)
	}
	strip(&root)
	canonical, err = yaml.Marshal(&root)
	if err != nil {
		return nil, "", err
	}
	s := sha256.Sum256(canonical)
	return canonical, hex.EncodeToString(s[:]), nil
}

func strip(n *yaml.Node) {
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	n.Style &^= yaml.FlowStyle
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		n.Style = 0
	}
	for _, c := range n.Content {
		strip(c)
	}
}
