package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"

	"gopkg.in/yaml.v3"
)

// MaxBody is the largest request body the API reads.
const MaxBody = 1 << 20

// bodyFormat is how a request body is written.
type bodyFormat int

const (
	formatJSON bodyFormat = iota
	formatYAML
)

// readBody reads a JSON or YAML body of at most MaxBody bytes, by its
// Content-Type (none is JSON).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bodyFormat, *problem) {
	format := formatJSON
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		switch {
		case err != nil:
			return nil, 0, &problem{code: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("Content-Type %q does not parse", ct),
				details: []detail{{Path: "Content-Type", Message: err.Error()}}}
		case mt == "application/json":
		case mt == "application/yaml", mt == "application/x-yaml", mt == "text/yaml":
			format = formatYAML
		default:
			return nil, 0, &problem{code: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("Content-Type %s: send application/json or application/yaml", mt),
				details: []detail{{Path: "Content-Type", Message: "want application/json or application/yaml"}}}
		}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, 0, &problem{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the body is over %d bytes", MaxBody),
			details: []detail{{Path: "", Message: "body too large"}}}
	case err != nil:
		return nil, 0, &problem{code: http.StatusBadRequest, msg: "read the body: " + err.Error()}
	case len(bytes.TrimSpace(data)) == 0:
		return nil, 0, &problem{code: http.StatusBadRequest, msg: "the body is empty", details: []detail{{Path: "", Message: "empty body"}}}
	}
	return data, format, nil
}

// readPipelineBody reads a pipeline body and returns it as YAML text: a
// JSON body is valid YAML already, but is checked as strict JSON first so
// its errors read as JSON errors.
func readPipelineBody(w http.ResponseWriter, r *http.Request) ([]byte, *problem) {
	data, format, prob := readBody(w, r)
	if prob != nil {
		return nil, prob
	}
	if format == formatJSON {
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, jsonProblem(data, err)
		}
		if _, ok := v.(map[string]any); !ok {
			return nil, &problem{code: http.StatusBadRequest, msg: "a pipeline must be a JSON object", details: []detail{{Path: "", Message: "not an object"}}}
		}
		var n yaml.Node
		if err := yaml.Unmarshal(data, &n); err != nil {
			return nil, yamlProblem(err)
		}
		out, err := yaml.Marshal(&n)
		if err != nil {
			return nil, yamlProblem(err)
		}
		return out, nil
	}
	return data, nil
}

// decodeStrict decodes a small request object, refusing unknown fields.
func decodeStrict(w http.ResponseWriter, r *http.Request, v any) *problem {
	data, format, prob := readBody(w, r)
	if prob != nil {
		return prob
	}
	if format == formatYAML {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(v); err != nil {
			return yamlProblem(err)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonProblem(data, err)
	}
	if dec.More() {
		return &problem{code: http.StatusBadRequest, msg: "malformed JSON", details: []detail{{Path: "", Message: "more than one JSON value"}}}
	}
	return nil
}

var unknownField = regexp.MustCompile(`^json: unknown field "(.*)"$`)

func jsonProblem(data []byte, err error) *problem {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line := 1 + bytes.Count(data[:min(int(syn.Offset), len(data))], []byte("\n"))
		return &problem{code: http.StatusBadRequest, msg: "malformed JSON", details: []detail{{Path: "", Line: line, Message: syn.Error()}}}
	case errors.As(err, &typ):
		return &problem{code: http.StatusBadRequest, msg: "wrong type", details: []detail{{Path: typ.Field, Message: fmt.Sprintf("want %s, got %s", typ.Type, typ.Value)}}}
	}
	if m := unknownField.FindStringSubmatch(err.Error()); m != nil {
		return &problem{code: http.StatusBadRequest, msg: "unknown field " + strconv.Quote(m[1]), details: []detail{{Path: m[1], Message: "unknown field"}}}
	}
	return &problem{code: http.StatusBadRequest, msg: "malformed JSON", details: []detail{{Path: "", Message: err.Error()}}}
}

var yamlLine = regexp.MustCompile(`line (\d+): (.*)`)

func yamlProblem(err error) *problem {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var ds []detail
		for _, e := range te.Errors {
			d := detail{Message: e}
			if m := yamlLine.FindStringSubmatch(e); m != nil {
				d.Line, _ = strconv.Atoi(m[1])
				d.Message = m[2]
				if f := regexp.MustCompile(`field (\S+) not found`).FindStringSubmatch(m[2]); f != nil {
					d.Path, d.Message = f[1], "unknown field"
				}
			}
			ds = append(ds, d)
		}
		return &problem{code: http.StatusBadRequest, msg: "the body does not match the expected fields", details: ds}
	}
	d := detail{Message: err.Error()}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		d.Line, _ = strconv.Atoi(m[1])
		d.Message = m[2]
	}
	return &problem{code: http.StatusBadRequest, msg: "malformed YAML", details: []detail{d}}
}
