// This file reads Kubernetes objects from files and directories:
// multi-document YAML, JSON, and List kinds. Errors name the file and line.

package facts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// LoadManifests reads every object from the given files and directories (directories
// recursively, files ending in .yaml, .yml or .json), in path order.
func LoadManifests(paths ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		files, err := expand(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			got, err := LoadManifestFile(f)
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

// LoadManifestFile reads the objects of one file: its YAML documents as kubectl
// splits them (apimachinery's YAMLReader; JSON is YAML), each error naming
// the file and the line.
func LoadManifestFile(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	// The reader returns a document's lines ended by "\n", the last one too:
	// with the file's lines ended the same way, each document is found in it
	// to number its lines.
	b = bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		b = append(b, '\n')
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var objs []*unstructured.Unstructured
	for offset := 0; ; {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, badSeparator(b, offset), err)
		}
		start := offset + index(b[offset:], doc)
		offset = start + len(doc)
		line := 1 + bytes.Count(b[:start], []byte("\n"))
		got, err := decode(doc)
		if err != nil {
			// YAML errors count lines from the document's start: make them
			// count from the file's.
			msg := err.Error()
			errLine := line + leadingBlankLines(doc)
			if m := yamlLine.FindStringSubmatch(msg); m != nil {
				n, _ := strconv.Atoi(m[1])
				errLine = line + n - 1
				msg = yamlLine.ReplaceAllString(msg, "line "+strconv.Itoa(errLine))
			}
			return nil, fmt.Errorf("%s:%d: %s", path, errLine, msg)
		}
		objs = append(objs, got...)
	}
}

// index is where doc, a run of whole lines, starts in b: at a line start,
// after at most some separator lines.
func index(b, doc []byte) int {
	if bytes.HasPrefix(b, doc) {
		return 0
	}
	if i := bytes.Index(b, append([]byte("\n"), doc...)); i >= 0 {
		return i + 1
	}
	return 0
}

// badSeparator is the line of the first separator after offset that the
// reader refuses ("---" followed by more than a comment).
func badSeparator(b []byte, offset int) int {
	line := 1 + bytes.Count(b[:offset], []byte("\n"))
	for _, l := range bytes.SplitAfter(b[offset:], []byte("\n")) {
		if rest, ok := bytes.CutPrefix(l, []byte("---")); ok {
			if t := bytes.TrimSpace(rest); len(t) > 0 && t[0] != '#' {
				return line
			}
		}
		line++
	}
	return line
}

func decode(doc []byte) ([]*unstructured.Unstructured, error) {
	j, err := utilyaml.ToJSON(doc)
	if err != nil {
		return nil, err
	}
	if bytes.Equal(j, []byte("null")) {
		return nil, nil // only comments
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

// leadingBlankLines counts the blank and comment lines a document starts
// with, so an error about the whole object names its first line.
func leadingBlankLines(doc []byte) int {
	n := 0
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			break
		}
		n++
	}
	return n
}

// ConstraintKind is the kind of nodeguard's Constraint.
const ConstraintKind = "K8sNodeGuard"

// ConstraintParameters reads spec.parameters of the K8sNodeGuard Constraint in
// a file: the same file a Gatekeeper user applies. No file ("") means no
// parameters: the rule's defaults.
func ConstraintParameters(path string) (map[string]any, error) {
	if path == "" {
		return nil, nil
	}
	objs, err := LoadManifestFile(path)
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
