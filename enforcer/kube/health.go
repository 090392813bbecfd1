package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
)

// ClusterHealth is what the Set knows of whether a workload API server answers.
type ClusterHealth struct {
	// Checked: a probe ran in this connection; before, Reachable means
	// nothing.
	Checked bool
	// Reachable: the last probe got an answer from the API server.
	Reachable bool
	// Since is when Reachable took its value.
	Since time.Time
	// Err is why the last probe failed, when it did.
	Err error
}

// Health checks, as Cluster API's clustercache makes them: one cheap request
// on a schedule of its own, and at once when any request or watch of the
// cluster fails. A healthy cluster costs two requests a minute; an
// unreachable one is probed more often, so its return is seen within
// seconds.
const (
	DefaultProbeInterval            = 30 * time.Second
	DefaultProbeTimeout             = 5 * time.Second
	DefaultUnreachableProbeInterval = 5 * time.Second
	leastTimeBetweenProbes          = time.Second
	probePath                       = "/readyz"
	defaultProbeBackoffBase         = time.Second
)

// probe asks the API server whether it is ready: /readyz, which every
// client may read (system:public-info-viewer) and which fails while the
// API server shuts down. An answer that refuses the credentials is an
// answer: reachable.
func probe(ctx context.Context, kube kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := kube.Discovery().RESTClient().Get().AbsPath(probePath).DoRaw(ctx)
	if err == nil || apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) {
		return nil
	}
	return fmt.Errorf("GET %s: %w", probePath, err)
}

// observer tells suspect of every request of a connection that got no
// answer, and of every response body (a watch) that broke: the Set then
// probes at once instead of at the next scheduled probe.
type observer struct {
	next    http.RoundTripper
	suspect func(error)
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.next.RoundTrip(req)
	if err != nil {
		if !callerEnded(req.Context(), err) {
			o.suspect(err)
		}
		return resp, err
	}
	resp.Body = &observedBody{ReadCloser: resp.Body, ctx: req.Context(), suspect: o.suspect}
	return resp, nil
}

// observedBody reports a body that ends in an error other than its end,
// unless its reader closed it first (a watch stopped).
type observedBody struct {
	io.ReadCloser
	ctx     context.Context
	suspect func(error)
	closed  atomic.Bool
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !b.closed.Load() && !callerEnded(b.ctx, err) {
		b.suspect(err)
	}
	return n, err
}

func (b *observedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// callerEnded says whether a request failed because its caller gave up
// (canceled it): nothing to say of the cluster. A deadline that passed
// says the cluster did not answer in time.
func callerEnded(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled)
}
