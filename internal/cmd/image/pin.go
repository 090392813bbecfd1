package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The two files that name the image; pin writes the same reference into both
// (charts/chart_test.go fails when they disagree).
const (
	chartValues   = "charts/nodeguard/values.yaml"
	kustomization = "enforcer/deploy/kustomization.yaml"
)

// pin points the chart and the kustomization at repository:tag@digest.
// Only the lines of those keys change: comments and layout stay.
func pin(root, repository, tag, digest string) error {
	if err := edit(filepath.Join(root, chartValues), func(doc *yaml.Node) (*yaml.Node, map[string]string, error) {
		img := lookup(doc, "image")
		if img == nil || img.Kind != yaml.MappingNode {
			return nil, nil, fmt.Errorf("no image: section")
		}
		return img, map[string]string{"repository": repository, "tag": tag, "digest": digest}, nil
	}); err != nil {
		return err
	}
	return edit(filepath.Join(root, kustomization), func(doc *yaml.Node) (*yaml.Node, map[string]string, error) {
		images := lookup(doc, "images")
		if images == nil || images.Kind != yaml.SequenceNode {
			return nil, nil, fmt.Errorf("no images: list")
		}
		for _, img := range images.Content {
			if n := lookup(img, "name"); n != nil && n.Value == "nodeguard" && img.Kind == yaml.MappingNode {
				return img, map[string]string{"newName": repository, "newTag": tag, "digest": digest}, nil
			}
		}
		return nil, nil, fmt.Errorf("no image named nodeguard in images:")
	})
}

// edit sets keys of the block mapping find returns, rewriting the lines
// that hold them and adding missing keys after the mapping's last line.
func edit(path string, find func(*yaml.Node) (*yaml.Node, map[string]string, error)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	m, values, err := find(doc.Content[0])
	if err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	lines := strings.Split(string(b), "\n")
	first := m.Content[0]
	indent := strings.Repeat(" ", first.Column-1)
	last := 0
	for i := 0; i+1 < len(m.Content); i += 2 {
		last = max(last, m.Content[i+1].Line)
	}
	var added []string
	for _, k := range slices.Sorted(maps.Keys(values)) {
		line := fmt.Sprintf("%s: %s", k, quote(values[k]))
		if v := lookup(m, k); v != nil {
			if v.Line != m.Content[slices.Index(m.Content, v)-1].Line || v.Kind != yaml.ScalarNode {
				return fmt.Errorf("pin %s: %s is not a one-line value", path, k)
			}
			l := lines[v.Line-1]
			lines[v.Line-1] = l[:len(l)-len(strings.TrimLeft(l, " -"))] + line + trailingComment(l)
			continue
		}
		added = append(added, indent+line)
	}
	lines = slices.Insert(lines, last, added...)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	return nil
}

// quote writes s as YAML would for a plain string.
func quote(s string) string {
	out, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Sprintf("%q", s)
	}
	return strings.TrimSuffix(string(out), "\n")
}

// trailingComment keeps a "  # ..." after the value.
func trailingComment(line string) string {
	if i := strings.Index(line, " #"); i >= 0 {
		return line[i:]
	}
	return ""
}

func lookup(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
