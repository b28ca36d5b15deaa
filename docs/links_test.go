package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#+ (.+)$`)
	notSlug = regexp.MustCompile(`[^a-z0-9 _-]`)
)

// anchors are a Markdown file's heading anchors, as GitHub makes them (a shell comment in a
// code block is no heading).
func anchors(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
		slug := notSlug.ReplaceAllString(strings.ToLower(strings.ReplaceAll(m[1], "`", "")), "")
		out[strings.ReplaceAll(slug, " ", "-")] = true
	}
	return out
}

// Every relative link in the README and docs/*.md names a file that exists and, after '#', one
// of its headings: documents are split and renamed, and a reader must not land nowhere.
func TestDocumentLinksResolve(t *testing.T) {
	files, err := filepath.Glob("*.md")
	require.NoError(t, err)
	files = append(files, "../README.md")
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			path := file
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
			}
			_, err := os.Stat(path)
			if !assert.NoError(t, err, "%s links %s", file, link) {
				continue
			}
			if anchor != "" {
				assert.True(t, anchors(t, path)[anchor], "%s links %s: no such heading in %s", file, link, path)
			}
		}
	}
}

var (
	// sectionRef is a reference by title, as code comments and the documents make them:
	// docs/operations.md, "Payday" (or operations.md "Payday", or [operations.md](...), "Payday").
	sectionRef = regexp.MustCompile(`((?:docs/)?[a-z]+\.md)(?:\]\([^)\s]*\))?,? "([A-Z0-9][^"\n]*)"`)
	// commentBreak joins a title that a comment wraps onto its next line.
	commentBreak = regexp.MustCompile(`\n[ \t]*(?://|#|--)?[ \t]*`)
	boldTitle    = regexp.MustCompile(`\*\*([^*\n]+?)\.?\*\*`)
	fence        = regexp.MustCompile("(?ms)^```.*?^```")
)

// titles are a document's headings and bold paragraph titles, without backticks.
func titles(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	text := fence.ReplaceAllString(string(b), "")
	var out []string
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.ReplaceAll(m[1], "`", ""))
	}
	for _, m := range boldTitle.FindAllStringSubmatch(text, -1) {
		out = append(out, strings.ReplaceAll(m[1], "`", ""))
	}
	return out
}

// names says whether a document's title names the section a reference's title does: the same
// words, or with the heading's number before them ("1. Find unknown payments") or its subtitle
// after a colon ("Payday: a burst through the start backlog").
func names(title, ref string) bool {
	if i := strings.Index(title, ". "); i > 0 && strings.Trim(title[:i], "0123456789") == "" {
		title = title[i+2:]
	}
	return strings.EqualFold(title, ref) || strings.HasPrefix(strings.ToLower(title), strings.ToLower(ref)+":")
}

// Every reference to a document's section by its title, in the documents and in the code's
// comments, names a heading or a bold paragraph title of that document: a renamed section must
// not leave a comment pointing at nothing.
func TestSectionReferencesResolve(t *testing.T) {
	root := ".."
	seen := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".data", "bin", "testdata", "results", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".yaml", ".yml", ".conf", ".sh":
		default:
			if d.Name() != "Makefile" && d.Name() != "Dockerfile" {
				return nil
			}
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := commentBreak.ReplaceAllString(string(b), " ")
		for _, m := range sectionRef.FindAllStringSubmatch(text, -1) {
			doc, ref := m[1], m[2]
			target := filepath.Join(root, doc)
			if !strings.HasPrefix(doc, "docs/") {
				if _, err := os.Stat(filepath.Join(root, "docs", doc)); err == nil {
					target = filepath.Join(root, "docs", doc)
				}
			}
			if _, err := os.Stat(target); !assert.NoError(t, err, "%s refers to %s, %q", path, doc, ref) {
				continue
			}
			seen++
			found := false
			for _, title := range titles(t, target) {
				found = found || names(title, ref)
			}
			assert.True(t, found, "%s refers to %s, %q: no such heading or bold title there", path, doc, ref)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotZero(t, seen, "no reference by title found: the pattern no longer matches how they are written")
}
