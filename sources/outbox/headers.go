package outbox

import (
	"encoding/json"
	"unicode/utf8"
)

// header is one entry of a row's headers object, value as it becomes
// metadata.
type header struct{ key, value string }

// decodeHeaders reads a headers column into out: each entry of the JSON
// object, string values unquoted, other values as their JSON text (null as
// ""). errText is set instead when raw is not a JSON object.
//
// Every event carries headers, so the common shape — a flat object whose
// keys and values are strings without escapes, numbers, booleans or null —
// is read in place: the entries are substrings of raw, with no allocation
// and no reflection. Anything else (escapes, nested values, invalid UTF-8,
// bad syntax) goes to encoding/json, whose reading defines the result:
// FuzzHeaders holds both to the same answer.
func decodeHeaders(raw string, out []header) (entries []header, errText string) {
	if entries, ok := scanFlatHeaders(raw, out); ok {
		return entries, ""
	}
	return decodeHeadersJSON(raw, out[:0])
}

// decodeHeadersJSON is decodeHeaders by encoding/json.
func decodeHeadersJSON(raw string, out []header) ([]header, string) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		return out, "headers column is not a JSON object: " + err.Error()
	}
	for k, v := range obj {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out = append(out, header{k, s})
		} else {
			out = append(out, header{k, string(v)})
		}
	}
	return out, ""
}

// scanFlatHeaders reads a flat JSON object whose keys and string values
// need no unescaping, appending its entries to out in order (a repeated key
// appears twice; the later wins, as in encoding/json). ok is false for any
// other input, valid JSON or not, and out is then not to be used.
func scanFlatHeaders(s string, out []header) (entries []header, ok bool) {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return nil, false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return out, skipSpace(s, i+1) == len(s)
	}
	for {
		key, j, ok := plainString(s, i)
		if !ok {
			return nil, false
		}
		i = skipSpace(s, j)
		if i >= len(s) || s[i] != ':' {
			return nil, false
		}
		i = skipSpace(s, i+1)
		if i >= len(s) {
			return nil, false
		}
		var value string
		switch c := s[i]; {
		case c == '"':
			value, j, ok = plainString(s, i)
		case c == '-' || c >= '0' && c <= '9':
			if j, ok = number(s, i); ok {
				value = s[i:j]
			}
		case c == 't':
			value, j, ok = literal(s, i, "true")
		case c == 'f':
			value, j, ok = literal(s, i, "false")
		case c == 'n':
			_, j, ok = literal(s, i, "null")
			value = "" // a null decodes into a string as nothing
		default:
			return nil, false // an object or array: encoding/json's
		}
		if !ok {
			return nil, false
		}
		out = append(out, header{key, value})
		i = skipSpace(s, j)
		if i >= len(s) {
			return nil, false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case '}':
			return out, skipSpace(s, i+1) == len(s)
		default:
			return nil, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t') {
		i++
	}
	return i
}

// plainString reads the JSON string starting at s[i] when it holds no
// escape and no control character and is valid UTF-8, so its text is the
// bytes between the quotes; end is the index after the closing quote.
func plainString(s string, i int) (text string, end int, ok bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	ascii := true
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			text = s[i+1 : j]
			if !ascii && !utf8.ValidString(text) {
				return "", 0, false // encoding/json replaces invalid bytes
			}
			return text, j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

// number returns the end of the JSON number starting at s[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(s string, i int) (end int, ok bool) {
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = digits(s, i+1)
	default:
		return 0, false
	}
	if i < len(s) && s[i] == '.' {
		j := digits(s, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := digits(s, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func digits(s string, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// literal reads word (true, false, null) at s[i].
func literal(s string, i int, word string) (text string, end int, ok bool) {
	if len(s)-i < len(word) || s[i:i+len(word)] != word {
		return "", 0, false
	}
	return word, i + len(word), true
}
