package gatekeeper_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/nodeguard/nodeguard/internal/gatekeeper"
)

const constraintsDir = "../../constraints"

// The generated template runs in Gatekeeper's own engine and judges a DELETE.
func TestTemplateRunsInGatekeepersEngine(t *testing.T) {
	ctx := context.Background()
	engine := newEngine(t, "constraint.yaml")
	node := nodeFrom(t, filepath.Join(constraintsDir, "tests/review-capd.yaml"))
	user := authenticationv1.UserInfo{Username: "kubernetes-admin", Groups: []string{"system:masters"}}

	violations, err := engine.ReviewDelete(ctx, node, user)
	require.NoError(t, err)
	assert.Empty(t, violations, "nothing synced, nothing linked")

	for _, obj := range readAll(t, filepath.Join(constraintsDir, "tests/capd-objects.yaml")) {
		require.NoError(t, engine.AddObject(ctx, obj))
	}
	violations, err = engine.ReviewDelete(ctx, node, user)
	require.NoError(t, err)
	require.Len(t, violations, 1)
	assert.Contains(t, violations[0].Msg, "DockerMachine default/dev-md-0-abcde")
	blocker := violations[0].Details["blocker"].(map[string]any)
	assert.Equal(t, "DockerMachine", blocker["kind"])
	assert.Equal(t, false, blocker["deleting"])
}

func newEngine(t *testing.T, constraint string) *gatekeeper.Engine {
	t.Helper()
	tmpl, err := os.ReadFile(filepath.Join(constraintsDir, "template.yaml"))
	require.NoError(t, err)
	cons, err := os.ReadFile(filepath.Join(constraintsDir, constraint))
	require.NoError(t, err)
	engine, err := gatekeeper.NewEngine(context.Background(), tmpl, cons)
	require.NoError(t, err)
	return engine
}

// readAll reads every object of a multi-document YAML file.
func readAll(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			require.ErrorIs(t, err, io.EOF)
			return out
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

func nodeFrom(t *testing.T, reviewPath string) *unstructured.Unstructured {
	t.Helper()
	objs := readAll(t, reviewPath)
	require.Len(t, objs, 1)
	review := objs[0]
	old, found, err := unstructured.NestedMap(review.Object, "request", "oldObject")
	require.NoError(t, err)
	require.True(t, found)
	return &unstructured.Unstructured{Object: old}
}
