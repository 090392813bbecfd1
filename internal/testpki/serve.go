package testpki

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

// Serve runs h behind nodeguard's TLS server on a loopback port, with a
// server certificate of p unless opts names one, until the test ends or stop
// is called; stop returns what the server's Serve returned.
func (p *CA) Serve(t testing.TB, h http.Handler, opts admission.TLSOptions) (url string, stop func() error) {
	t.Helper()
	if opts.CertFile == "" {
		opts.CertFile, opts.KeyFile = p.ServerFiles(t, "server")
	}
	srv, err := admission.NewTLSServer(h, opts, nil)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l, 5*time.Second) }()
	var once sync.Once
	var stopErr error
	stop = func() error { once.Do(func() { cancel(); stopErr = <-done }); return stopErr }
	t.Cleanup(func() { _ = stop() })
	return "https://" + l.Addr().String(), stop
}

// Post posts body to url with client and returns the status, the body, and
// for a 200 the body decoded as a T.
func Post[T any](t testing.TB, client *http.Client, url, contentType string, body []byte) (int, string, *T) {
	t.Helper()
	resp, err := client.Post(url, contentType, bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, string(raw), nil
	}
	var out T
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, string(raw), &out
}

// Ask posts an AdmissionReview to url and returns the response it carries;
// an answer that is not an AdmissionReview with a response is an error.
func Ask(client *http.Client, url string, review []byte) (*admissionv1.AdmissionResponse, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(review))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if out.Response == nil {
		return nil, fmt.Errorf("status %d: an AdmissionReview without a response", resp.StatusCode)
	}
	return out.Response, nil
}
