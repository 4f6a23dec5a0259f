package migrate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
)

// Parse reads a connector configuration: JSON (Kafka Connect's REST form
// {"name", "config": {…}} or a flat object) when it starts with "{", else
// Java properties. Debezium Server's prefixes (debezium.source.,
// debezium.transforms., debezium.sink.) are normalised: source options lose
// their prefix, transforms.* keep theirs, sink options stay as they are.
func Parse(data []byte) (map[string]string, error) {
	trimmed := strings.TrimSpace(string(data))
	var cfg map[string]string
	var err error
	if strings.HasPrefix(trimmed, "{") {
		cfg, err = parseJSON([]byte(trimmed))
	} else {
		cfg, err = parseProperties(trimmed)
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, v := range cfg {
		switch {
		case strings.HasPrefix(k, "debezium.source."):
			k = strings.TrimPrefix(k, "debezium.source.")
		case strings.HasPrefix(k, "debezium.transforms"):
			k = strings.TrimPrefix(k, "debezium.")
		case strings.HasPrefix(k, "debezium.format."):
			k = "format." + strings.TrimPrefix(k, "debezium.format.")
		}
		out[k] = v
	}
	return out, nil
}

func parseJSON(data []byte) (map[string]string, error) {
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	name, _ := doc["name"].(string)
	if c, ok := doc["config"].(map[string]any); ok {
		doc = c
	}
	out := map[string]string{}
	for k, v := range doc {
		switch v := v.(type) {
		case string:
			out[k] = v
		case nil:
		default:
			b, _ := json.Marshal(v)
			out[k] = strings.Trim(string(b), `"`)
		}
	}
	if _, ok := out["name"]; !ok && name != "" {
		out["name"] = name
	}
	return out, nil
}

// parseProperties reads the java.util.Properties text format: key=value or
// key:value or key value, # and ! comments, backslash line continuations
// and escapes.
func parseProperties(text string) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	var logical strings.Builder
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if logical.Len() == 0 && (line == "" || line[0] == '#' || line[0] == '!') {
			continue
		}
		if trailingBackslashes(line)%2 == 1 {
			logical.WriteString(line[:len(line)-1])
			continue
		}
		logical.WriteString(line)
		k, v := splitProperty(logical.String())
		logical.Reset()
		if k == "" {
			return nil, fmt.Errorf("line %d: no key", lineNo)
		}
		out[k] = v
	}
	return out, sc.Err()
}

func trailingBackslashes(s string) int {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n
}

func splitProperty(s string) (string, string) {
	var key strings.Builder
	i := 0
	for i < len(s) {
		c := s[i]
		if c == '\\' && i+1 < len(s) {
			key.WriteByte(unescape(s[i+1]))
			i += 2
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' {
			break
		}
		key.WriteByte(c)
		i++
	}
	rest := strings.TrimLeft(s[i:], " \t")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t")
	}
	var val strings.Builder
	for j := 0; j < len(rest); j++ {
		if rest[j] == '\\' && j+1 < len(rest) {
			val.WriteByte(unescape(rest[j+1]))
			j++
			continue
		}
		val.WriteByte(rest[j])
	}
	return key.String(), val.String()
}

func unescape(c byte) byte {
	switch c {
	case 't':
		return '\t'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 'f':
		return '\f'
	}
	return c
}
