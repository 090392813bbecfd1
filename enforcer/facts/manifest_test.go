package facts_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/facts"
)

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

func names(t *testing.T, paths ...string) []string {
	t.Helper()
	objs, err := facts.LoadManifests(paths...)
	require.NoError(t, err)
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

func TestLoadMultiDocumentYAMLJSONAndLists(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", "# leading comment\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\n# only a comment\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2}\n")
	write(t, dir, "sub/b.json", `{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3"}}]}`)
	write(t, dir, "sub/ignored.txt", "not a manifest")
	assert.Equal(t, []string{"Node/n1", "Node/n2", "Node/n3"}, names(t, dir))
	assert.Equal(t, []string{"Node/n3"}, names(t, filepath.Join(dir, "sub/b.json")))
}

func TestLoadErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ file, content, want string }{
		{"bad.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: [unclosed\n", `bad\.yaml:8: .*line 8`},
		{"nokind.yaml", "\n\napiVersion: v1\nmetadata: {name: x}\n", `nokind\.yaml:3: not a Kubernetes object`},
		{"noname.yaml", "apiVersion: v1\nkind: Node\nmetadata: {}\n", `noname\.yaml:1: Node has no metadata\.name`},
		// Lines count from the file's start across separators (with
		// comments), comment-only documents and CRLF line ends.
		{"third.yaml", "apiVersion: v1\r\nkind: Node\r\nmetadata: {name: a}\r\n--- # second\r\n# only a comment\r\n---\r\n---\r\n" +
			"apiVersion: v1\r\nkind: Node\r\nmetadata:\r\n  name: [unclosed\r\n", `third\.yaml:11: .*line 11`},
		{"separator.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\n--- not a comment\napiVersion: v1\n",
			`separator\.yaml:5: invalid Yaml document separator: not a comment`},
		{"bad.json", "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Node\",\n  \"metadata\": {\"name\": \"x\"\n}\n", `bad\.json:\d+: `},
	} {
		_, err := facts.LoadManifests(write(t, dir, tc.file, tc.content))
		if assert.Error(t, err, tc.file) {
			assert.Regexp(t, tc.want, err.Error())
		}
	}

	_, err := facts.LoadManifests(filepath.Join(dir, "missing.yaml"))
	assert.ErrorContains(t, err, "missing.yaml")

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	_, err = facts.LoadManifests(empty)
	assert.ErrorContains(t, err, "no .yaml, .yml or .json files")
}

func TestConstraintParameters(t *testing.T) {
	params, err := facts.ConstraintParameters("../../constraints/constraint.yaml")
	require.NoError(t, err)
	assert.Equal(t, false, params["allowUnverifiedKinds"])
	assert.NotEmpty(t, params["infraMachineKinds"])

	params, err = facts.ConstraintParameters("")
	require.NoError(t, err)
	assert.Nil(t, params, "no file: the rule's defaults")

	_, err = facts.ConstraintParameters("../../constraints/syncset.yaml")
	assert.ErrorContains(t, err, "want exactly one K8sNodeGuard, found 0")
}
