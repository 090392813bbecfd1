// Package doclinks checks the project's Markdown: every relative link leads
// to a file and, when it names one, to a heading there; the README stays a
// front page that reaches every page of docs/ in one click.
package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const root = "../.."

// maxReadmeLines keeps the README a front page (issue 24); the manual is in docs/.
const maxReadmeLines = 150

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile("(?m)^#{1,6} +(.+?) *$")
	fence   = regexp.MustCompile("(?ms)^```.*?^```")
	// What GitHub drops from a heading to make its anchor.
	unanchored = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	return append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "CONTRIBUTING.md")}, docs...)
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return fence.ReplaceAllString(string(b), "")
}

// anchors are the fragment names GitHub gives a page's headings.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		a := strings.ReplaceAll(unanchored.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func TestRelativeLinksLeadSomewhere(t *testing.T) {
	for _, page := range pages(t) {
		text := read(t, page)
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := page
			if file != "" {
				dest = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(dest); !assert.NoError(t, err, "%s links to %s", page, target) {
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			assert.True(t, anchors(read(t, dest))[frag], "%s links to %s: no such heading in %s", page, target, dest)
		}
	}
}

func TestTheReadmeIsAFrontPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	readme := string(b)
	assert.LessOrEqual(t, strings.Count(readme, "\n"), maxReadmeLines, "README.md: move reference material to docs/")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, d := range docs {
		name := "docs/" + filepath.Base(d)
		assert.Contains(t, readme, "]("+name+")", "README.md does not link %s", name)
	}
}
