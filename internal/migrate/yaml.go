package migrate

import (
	"encoding/json"
	"fmt"
	"strings"
)

// yaml writes the pipeline: the comments heading it, its sections, and the
// unmapped options as comments at the end (their values hidden when the key
// says secret).
func (p *pipeline) yaml(comments []string, notes []Note) string {
	var b strings.Builder
	b.WriteString("# Translated by `ferry migrate debezium` from the Debezium PostgreSQL connector and its outbox\n")
	b.WriteString("# EventRouter. Check it with `ferry validate --connect -c FILE`.\n")
	for _, c := range comments {
		b.WriteString("# " + c + "\n")
	}
	if p.passwordVar != "" {
		fmt.Fprintf(&b, "# database.password is not copied: export %s before running Ferry.\n", p.passwordVar)
	}
	fmt.Fprintf(&b, "name: %s\nsource:\n", p.name)
	for _, l := range p.source {
		b.WriteString("  " + l + "\n")
	}
	b.WriteString("  columns:\n")
	for _, c := range p.columns.lines() {
		b.WriteString("    " + c + "\n")
	}
	b.WriteString("transforms:\n")
	for i, l := range p.router {
		if i == 0 {
			b.WriteString("  - " + l + "\n")
		} else {
			b.WriteString("    " + l + "\n")
		}
	}
	var quoted []string
	for _, br := range splitList(p.brokers) {
		quoted = append(quoted, yamlString(br))
	}
	fmt.Fprintf(&b, "sink:\n  type: kafka\n  brokers: [%s]\n  topic: %s   # required; the event router sets each event's topic\n",
		strings.Join(quoted, ", "), p.name+".unrouted")
	if p.deadLetter != "" {
		fmt.Fprintf(&b, "dead_letter:\n  topic: %s\n", p.deadLetter)
	}
	if len(notes) > 0 {
		b.WriteString("# Not translated:\n")
		for _, n := range notes {
			v := n.Value
			if strings.Contains(strings.ToLower(n.Key), "password") || strings.Contains(strings.ToLower(n.Key), "secret") ||
				strings.Contains(strings.ToLower(n.Key), "jaas") {
				v = "(hidden)"
			}
			fmt.Fprintf(&b, "#   %s=%s: %s\n", n.Key, v, n.Why)
		}
	}
	return b.String()
}

// yamlString quotes s for YAML when it needs it.
func yamlString(s string) string {
	if s == "" || strings.ContainsAny(s, `:#{}[],&*!|>'"%@`+"`") || strings.TrimSpace(s) != s {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSuffix(b.String(), "\n")
	}
	return s
}
