package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The markers a page of docs/ puts on the line before a fenced block: a
// caddyfile block that is a whole config, which `caddy adapt` must take,
// and a JSON block that must be what `caddy adapt` makes of the full
// caddyfile block before it on the same page.
const (
	docsFullConfig  = "<!-- docs: full config -->"
	docsAdaptedJSON = "<!-- docs: adapted from the caddyfile above -->"
)

// docsAdaptTimeout bounds one `caddy adapt`, which reads no file and opens
// no connection: well under a second.
const docsAdaptTimeout = 30 * time.Second

// docsBlock is a marked fenced block of a page.
type docsBlock struct {
	page   string
	line   int
	marker string
	lang   string
	body   string
}

// markedDocsBlocks returns the marked blocks of every page under docs/ and
// of the README, in page order. A marker not followed by a fenced block,
// or a block that does not end, fails the test.
func markedDocsBlocks(t *testing.T) []docsBlock {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(repoRoot, "README.md"))
	var blocks []docsBlock
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, page)
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			marker := strings.TrimSpace(lines[i])
			if marker != docsFullConfig && marker != docsAdaptedJSON {
				continue
			}
			// A block in a list item is indented as its marker is.
			indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
			open := i + 1
			if open >= len(lines) || !strings.HasPrefix(lines[open], indent+"```") {
				t.Fatalf("%s:%d: %s is not followed by a fenced block", rel, i+1, marker)
			}
			lang := strings.TrimPrefix(lines[open], indent+"```")
			end := open + 1
			for end < len(lines) && lines[end] != indent+"```" {
				end++
			}
			if end == len(lines) {
				t.Fatalf("%s:%d: the block does not end", rel, open+1)
			}
			var body strings.Builder
			for _, l := range lines[open+1 : end] {
				body.WriteString(strings.TrimPrefix(l, indent))
				body.WriteByte('\n')
			}
			blocks = append(blocks, docsBlock{page: rel, line: open + 1, marker: marker, lang: lang, body: body.String()})
			i = end
		}
	}
	return blocks
}

// adaptDocsConfig runs the built caddy's `caddy adapt` on a Caddyfile and
// returns the JSON it makes, or its output when it refuses.
func adaptDocsConfig(t *testing.T, caddyfile string) (adapted []byte, output string, ok bool) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), docsAdaptTimeout)
	defer cancel()
	cmd := boundedCommand(ctx, caddyBin, "adapt", "--config", path, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(dir, "home"), "XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String() + stdout.String(), false
	}
	return stdout.Bytes(), stderr.String(), true
}

// TestDocsConfigs adapts, with the built caddy, every caddyfile block of
// the docs marked as a full config, and checks that every JSON block
// marked as adapted from the caddyfile above it is exactly what `caddy
// adapt` makes of that caddyfile: a change to the config's shape, or to a
// directive's syntax, fails here until the reference shows it.
func TestDocsConfigs(t *testing.T) {
	blocks := markedDocsBlocks(t)
	var full, adaptedBlocks int
	var last struct {
		page    string
		adapted []byte
	}
	for _, b := range blocks {
		where := fmt.Sprintf("%s:%d", b.page, b.line)
		switch b.marker {
		case docsFullConfig:
			if b.lang != "caddyfile" {
				t.Errorf("%s: a full config is a caddyfile block, not %q", where, b.lang)
				continue
			}
			full++
			adapted, output, ok := adaptDocsConfig(t, b.body)
			if !ok {
				t.Errorf("%s: caddy adapt refuses this full config:\n%s", where, output)
				last.page, last.adapted = "", nil
				continue
			}
			last.page, last.adapted = b.page, adapted
		case docsAdaptedJSON:
			adaptedBlocks++
			if b.lang != "json" {
				t.Errorf("%s: an adapted config is a json block, not %q", where, b.lang)
				continue
			}
			if last.page != b.page || last.adapted == nil {
				t.Errorf("%s: no full caddyfile block that adapts comes before this JSON on its page", where)
				continue
			}
			var want, got any
			if err := json.Unmarshal([]byte(b.body), &got); err != nil {
				t.Errorf("%s: the JSON block does not parse: %v", where, err)
				continue
			}
			if err := json.Unmarshal(last.adapted, &want); err != nil {
				t.Fatalf("%s: caddy adapt gave JSON that does not parse: %v", where, err)
			}
			if !reflect.DeepEqual(want, got) {
				pretty, _ := json.MarshalIndent(want, "", "\t")
				t.Errorf("%s: the JSON block is not what caddy adapt makes of the caddyfile above it; caddy adapt gives:\n%s", where, firstLines(string(pretty), 400))
			}
		}
	}
	// The JSON reference holds two pairs, and the cluster, operations and
	// Caddyfile reference pages full configs of their own: a walk that
	// finds fewer has lost its markers, and would check nothing.
	if full < 6 || adaptedBlocks < 2 {
		t.Fatalf("found %d full configs and %d adapted JSON blocks in docs/; want at least 6 and 2 (are the markers %q and %q still there?)",
			full, adaptedBlocks, docsFullConfig, docsAdaptedJSON)
	}
}

// firstLines is s cut to its first n lines.
func firstLines(s string, n int) string {
	var out strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(nil, 1<<20)
	for i := 0; i < n && sc.Scan(); i++ {
		out.WriteString(sc.Text())
		out.WriteByte('\n')
	}
	return out.String()
}
