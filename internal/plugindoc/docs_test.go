package plugindoc_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The README is the front door: what Ferry is, the two commands, a first
// pipeline and links. Everything longer lives in a guide under docs/.
func TestREADMEIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 400 {
		t.Errorf("README.md has %d lines, more than 400: move the detail into a guide under docs/ and link it", n)
	}
}

// Every relative link in README.md and docs/**/*.md names a file or
// directory that exists and, with a #fragment into a Markdown file, a
// heading of that file, so moving text between guides cannot leave a
// dangling link.
func TestDocLinksResolve(t *testing.T) {
	files := docFiles(t)
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files: %v", len(files), files)
	}
	anchors := map[string]map[string]bool{} // file → its heading anchors
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = headingAnchors(string(b))
		return anchors[path]
	}
	var checked int
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, l := range links(string(b)) {
			target, fragment, _ := strings.Cut(l.target, "#")
			dest := file
			if target != "" {
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(target))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: no such file or directory", rel, l.line, l.target)
					continue
				}
			}
			checked++
			if fragment == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				if !regexp.MustCompile(`^L\d+(-L\d+)?$`).MatchString(fragment) {
					t.Errorf("%s:%d: link %q: a fragment into a file that is not Markdown", rel, l.line, l.target)
				}
				continue
			}
			if !anchorsOf(dest)[fragment] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", rel, l.line, l.target, filepath.Base(dest), fragment)
			}
		}
	}
	if checked < 100 {
		t.Errorf("checked only %d relative links", checked)
	}
}

// Every guide says in its first sentence what it covers: the line after
// its title is prose, not a table, a list, code or another heading.
func TestGuidesOpenWithASentence(t *testing.T) {
	for _, file := range docFiles(t) {
		rel, _ := filepath.Rel(root, file)
		if filepath.Base(file) == "README.md" && filepath.Dir(file) == root {
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if !strings.HasPrefix(lines[0], "# ") {
			t.Errorf("%s: the first line is not a title (# …)", rel)
			continue
		}
		for _, l := range lines[1:] {
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "<!--") {
				continue
			}
			if strings.ContainsAny(l[:1], "#|-*>!") || orderedItem.MatchString(l) {
				t.Errorf("%s: opens with %q, not a sentence on what it covers", rel, l)
			}
			break
		}
	}
}

var orderedItem = regexp.MustCompile(`^\d+[.)]\s`)

// docFiles is README.md and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

type link struct {
	target string
	line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// links returns the relative link targets of a Markdown text, outside
// fenced code blocks and code spans; URLs with a scheme are left out.
func links(md string) []link {
	var out []link
	fenced := false
	for i, l := range strings.Split(md, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		l = codeSpan.ReplaceAllString(l, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(l); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			target = strings.Trim(target, "<>")
			if target == "" || scheme.MatchString(target) {
				continue
			}
			out = append(out, link{target: target, line: i + 1})
		}
	}
	return out
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// headingAnchors returns the anchors GitHub gives a Markdown file's
// headings (outside fenced code), numbered -1, -2, … when repeated, and
// those of explicit <a name> / <a id> tags.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(md, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := slugify(m[2])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// slugify is GitHub's heading anchor: the text as rendered (links become
// their text, code spans their content), lowercased, with everything but
// letters, digits, marks, _, - and spaces dropped and spaces made hyphens.
func slugify(heading string) string {
	heading = mdLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// The README links every guide (docs/*.md) and the component reference,
// so none is reachable only by browsing the directory.
func TestREADMELinksEveryGuide(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, l := range links(string(b)) {
		target, _, _ := strings.Cut(l.target, "#")
		linked[filepath.Clean(target)] = true
	}
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range append(guides, filepath.Join(root, "docs", "reference", "README.md")) {
		rel, _ := filepath.Rel(root, g)
		if !linked[rel] {
			t.Errorf("README.md does not link %s", rel)
		}
	}
}
