package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/internal/redact"
)

// apiFlags are the flags of the commands that talk to a running ferry's
// API (pipelines, tokens, tenants, secrets, lag, doctor): one way to say
// where it runs and with which token, with or without its --store.
type apiFlags struct {
	url, tokenFile, output string
}

func (a *apiFlags) register(fs *flag.FlagSet) {
	def := os.Getenv("FERRY_URL")
	if def == "" {
		def = defaultURL
	}
	fs.StringVar(&a.url, "url", def, "a running ferry's --http address: a URL, host:port, :port or a port (else $FERRY_URL)")
	fs.StringVar(&a.tokenFile, "token-file", "", "file holding the API token (else the token itself in $FERRY_TOKEN)")
	fs.StringVar(&a.output, "o", "table", "output: table, json or yaml")
}

// apiClient calls /api/v1.
type apiClient struct {
	base, token string
	http        *http.Client
}

func (a *apiFlags) client() (*apiClient, error) {
	switch a.output {
	case "table", "json", "yaml":
	default:
		return nil, fmt.Errorf("-o: want table, json or yaml, got %q", a.output)
	}
	tok, err := apiToken(a.tokenFile)
	if err != nil {
		return nil, err
	}
	return &apiClient{base: strings.TrimSuffix(apiURL(a.url), "/") + "/api/v1", token: tok, http: &http.Client{Timeout: 30 * time.Second}}, nil
}

// apiToken is the API token from file, else $FERRY_TOKEN (empty when
// neither is set: an instance without tokens answers reads without one).
func apiToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv("FERRY_TOKEN")), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// apiError is a non-2xx answer.
type apiError struct {
	Status  int
	Message string `json:"error"`
	Details []struct {
		Path    string `json:"path"`
		Line    int    `json:"line"`
		Message string `json:"message"`
	} `json:"details"`
	CurrentVersion *int64 `json:"current_version"`
}

func (e *apiError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
	if e.Status == http.StatusUnauthorized {
		b.WriteString(" (give the token with --token-file FILE, or the token itself in $FERRY_TOKEN)")
	}
	for _, d := range e.Details {
		if d.Line == 0 && (d.Message == e.Message || d.Path+": "+d.Message == e.Message) {
			continue // the message already says it
		}
		b.WriteString("\n  ")
		if d.Line > 0 {
			fmt.Fprintf(&b, "line %d: ", d.Line)
		}
		if d.Path != "" {
			b.WriteString(d.Path + ": ")
		}
		b.WriteString(d.Message)
	}
	return b.String()
}

// call sends a request and decodes a JSON answer into out (when not nil).
func (c *apiClient) call(method, path, contentType string, body []byte, out any, header ...string) (http.Header, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, redact.Error(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		e := &apiError{Status: resp.StatusCode}
		if json.Unmarshal(raw, e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(raw))
		}
		return resp.Header, e
	}
	if out != nil {
		if b, ok := out.(*[]byte); ok {
			*b = raw
			return resp.Header, nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// printAs prints v as JSON or YAML.
func printAs(w io.Writer, format string, v any) error {
	if format == "yaml" {
		// Through JSON, so field names are the API's.
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var generic any
		if err := yaml.Unmarshal(b, &generic); err != nil {
			return err
		}
		out, err := yaml.Marshal(generic)
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
