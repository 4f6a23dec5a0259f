package httpapi

import (
	"net/http"
)

func (c *api) plugins(w http.ResponseWriter, r *http.Request, _ principal) {
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (c *api) openAPI(w http.ResponseWriter, r *http.Request, _ principal) {
	writeJSON(w, http.StatusOK, map[string]any{})
}
