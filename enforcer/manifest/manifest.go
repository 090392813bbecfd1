// Package manifest reads Kubernetes objects from files and directories:
// multi-document YAML, JSON, and List kinds. Errors name the file and line.
package manifest

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Load reads every object from the given files and directories (directories
// recursively, files ending in .yaml, .yml or .json), in path order.
func Load(paths ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		files, err := expand(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			got, err := LoadFile(f)
			if err != nil {
				return nil, err
			}
			objs = append(objs, got...)
		}
	}
	return objs, nil
}

func expand(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch strings.ToLower(filepath.Ext(p)) {
		case ".yaml", ".yml", ".json":
			if !d.IsDir() {
				files = append(files, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", path, err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("read directory %s: no .yaml, .yml or .json files", path)
	}
	return files, nil
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// LoadFile reads the objects of one file.
func LoadFile(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range split(b) {
		if len(bytes.TrimSpace(stripComments(doc.body))) == 0 {
			continue
		}
		got, err := decode(doc.body)
		if err != nil {
			// YAML errors count lines from the document's start: make them
			// count from the file's.
			msg := err.Error()
			line := doc.line + leadingBlankLines(doc.body)
			if m := yamlLine.FindStringSubmatch(msg); m != nil {
				n, _ := strconv.Atoi(m[1])
				line = doc.line + n - 1
				msg = yamlLine.ReplaceAllString(msg, "line "+strconv.Itoa(line))
			}
			return nil, fmt.Errorf("%s:%d: %s", path, line, msg)
		}
		objs = append(objs, got...)
	}
	return objs, nil
}

type document struct {
	line int // 1-based line of the document's first line in the file
	body []byte
}

// split cuts a file at "---" separator lines, remembering where each
// document starts.
func split(b []byte) []document {
	var docs []document
	cur := document{line: 1}
	lines := bytes.SplitAfter(b, []byte("\n"))
	for i, l := range lines {
		t := bytes.TrimRight(l, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			docs = append(docs, cur)
			cur = document{line: i + 2}
			continue
		}
		cur.body = append(cur.body, l...)
	}
	return append(docs, cur)
}

func decode(doc []byte) ([]*unstructured.Unstructured, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(j); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	if u.IsList() {
		list, err := u.ToList()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", u.GetKind(), err)
		}
		out := make([]*unstructured.Unstructured, 0, len(list.Items))
		for i := range list.Items {
			if err := validate(&list.Items[i]); err != nil {
				return nil, fmt.Errorf("%s item %d: %w", u.GetKind(), i, err)
			}
			out = append(out, &list.Items[i])
		}
		return out, nil
	}
	if err := validate(u); err != nil {
		return nil, err
	}
	return []*unstructured.Unstructured{u}, nil
}

func validate(u *unstructured.Unstructured) error {
	if u.GetName() == "" {
		return fmt.Errorf("%s has no metadata.name", u.GetKind())
	}
	return nil
}

func leadingBlankLines(doc []byte) int {
	n := 0
	for _, l := range bytes.Split(doc, []byte("\n")) {
		t := bytes.TrimSpace(l)
		if len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			break
		}
		n++
	}
	return n
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		t := bytes.TrimSpace(l)
		if len(t) == 0 || t[0] == '#' || bytes.Equal(t, []byte("---")) {
			continue
		}
		out = append(out, l)
	}
	return bytes.Join(out, []byte("\n"))
}

// ConstraintKind is the kind of nodeguard's Constraint.
const ConstraintKind = "K8sNodeGuard"

// ConstraintParameters reads spec.parameters of the K8sNodeGuard Constraint in
// a file: the same file a Gatekeeper user applies.
func ConstraintParameters(path string) (map[string]any, error) {
	objs, err := LoadFile(path)
	if err != nil {
		return nil, err
	}
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == ConstraintKind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("%s: want exactly one %s, found %d", path, ConstraintKind, len(found))
	}
	params, _, err := unstructured.NestedMap(found[0].Object, "spec", "parameters")
	if err != nil {
		return nil, fmt.Errorf("%s: spec.parameters: %w", path, err)
	}
	return params, nil
}
