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

// anchors are a Markdown file's heading anchors, as GitHub makes them.
func anchors(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(b), -1) {
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
