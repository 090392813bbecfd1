package admission_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

func TestProbes(t *testing.T) {
	var mu sync.Mutex
	readyErr := errors.New("waiting for DockerMachine")
	ready := func() error { mu.Lock(); defer mu.Unlock(); return readyErr }
	srv := httptest.NewServer(admission.ProbeHandler(ready))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/healthz")
	assert.Equal(t, http.StatusOK, code)
	code, body := get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "waiting for DockerMachine")
	mu.Lock()
	readyErr = nil
	mu.Unlock()
	code, _ = get("/readyz")
	assert.Equal(t, http.StatusOK, code)
	code, _ = get("/validate")
	assert.Equal(t, http.StatusNotFound, code, "the probe port serves no reviews")
}
