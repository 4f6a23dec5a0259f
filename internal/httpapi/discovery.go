package httpapi

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/plugindoc"
	"github.com/ferryhq/ferry/plugins"
)

// plugins lists every registered source, transform and sink type with its
// config keys, types, defaults and doc text.
func (c *api) plugins(w http.ResponseWriter, _ *http.Request, _ principal) {
	reg := c.o.Control.Registry
	if reg == nil {
		reg = plugins.Default
	}
	writeJSON(w, http.StatusOK, map[string]any{"plugins": plugindoc.Catalog(reg)})
}

//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPI returns the API's OpenAPI 3.1 document as JSON.
var OpenAPI = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, err
	}
	return json.MarshalIndent(doc, "", "  ")
})

func (c *api) openAPI(w http.ResponseWriter, _ *http.Request, _ principal) {
	b, err := OpenAPI()
	if err != nil {
		writeProblem(w, &problem{code: http.StatusInternalServerError, msg: "openapi document: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
