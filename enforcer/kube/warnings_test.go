package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// The API server's warnings reach the JSON log once each.
func TestWarningsAreLoggedOnceEachAsJSON(t *testing.T) {
	var out bytes.Buffer
	h := kube.LogWarnings(slog.New(slog.NewJSONHandler(&out, nil)))
	for range 3 {
		h.HandleWarningHeaderWithContext(context.Background(), 299, "-", "infrastructure.cluster.x-k8s.io/v1beta2 DockerMachine is deprecated")
	}
	h.HandleWarningHeaderWithContext(context.Background(), 299, "-", "another")
	h.HandleWarningHeaderWithContext(context.Background(), 199, "-", "not a warning header the API server sends")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	assert.Equal(t, "API server warning", first["msg"])
	assert.Equal(t, "infrastructure.cluster.x-k8s.io/v1beta2 DockerMachine is deprecated", first["warning"])
}
