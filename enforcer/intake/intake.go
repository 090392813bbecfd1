// Package intake bounds the work nodeguard takes on from its HTTPS routes,
// whatever the route: the bytes of requests being read and answered (a byte
// budget), the work done at once (slots), concurrent requests with the same
// input sharing one piece of work, each request's deadline, and what a
// rejected request costs in logs. The admission review routes and the
// external data routes share one Intake, so together they stay within one
// budget.
package intake

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

// MaxBodyBytes bounds a request. An AdmissionReview of a Node DELETE carries
// the Node once (oldObject). A real Node is tens of KiB (kubelet reports at
// most 50 images by default); the API server caps its annotations at 256 KiB,
// and its managed fields list their keys once more, so a legitimate Node
// stays well under 1 MiB (webhook's TestLargestRealNodeFits). Past the limit
// the answer is 413 and the failurePolicy (Fail) denies, so the limit keeps
// that headroom; memory per request is bounded by decoding only what the rule
// reads, not by this.
const MaxBodyBytes = 1 << 20

// inFlightBodyBytes bounds the request bytes being decoded and answered at
// once. A real review is a few KiB, so hundreds fit; ~1 MiB forged ones go
// four at a time: what a review costs while it is decoded (a user's groups
// become one string each) stays live until its answer, and with the
// deployment's GOGC=400 the heap grows to five times what is live.
const inFlightBodyBytes = 4 * MaxBodyBytes

// DefaultMaxConcurrent bounds the decisions (or provider answers) made at
// once: one is ~0.5 ms of CPU plus fresh reads that wait on the API server,
// so a few per core keep the cores busy while a flood queues instead of
// multiplying memory and API requests.
const DefaultMaxConcurrent = 16

// Reasons of nodeguard_rejected_requests_total: why a request got an HTTP
// error instead of an answer.
const (
	RejectMethod      = "method"
	RejectClientCert  = "client-cert"
	RejectContentType = "content-type"
	RejectTooLarge    = "too-large"
	RejectRead        = "read"
	RejectBusy        = "busy" // large requests waited past the deadline
)

// Options configure an Intake.
type Options struct {
	// Timeout is each request's deadline (default 4s).
	Timeout time.Duration
	// MaxConcurrent bounds the work done at once; the others wait within
	// their deadline (default DefaultMaxConcurrent).
	MaxConcurrent int
	Metrics       *Metrics
	Log           *slog.Logger
	// LogInterval is the least time between two log lines about rejected
	// requests (default 1s); the lines between are counted, not written.
	LogInterval time.Duration
}

// Intake is safe for concurrent use.
type Intake struct {
	opts Options
	// slots bounds concurrent work; its waiters are served in order.
	slots *semaphore.Weighted
	// bodies bounds the bytes of requests being decoded and answered.
	bodies *semaphore.Weighted
	// flights lets concurrent requests with the same input share one piece
	// of work. It holds a result only while it is being made: a request
	// arriving after it was answered makes its own.
	flights singleflight.Group
	// rejectLog writes at most one line per LogInterval; rejected counts
	// the rejections since the last line.
	rejectLog rate.Sometimes
	rejected  atomic.Int64
}

// New returns an Intake.
func New(opts Options) *Intake {
	if opts.Timeout == 0 {
		opts.Timeout = 4 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = time.Second
	}
	return &Intake{opts: opts, slots: semaphore.NewWeighted(int64(opts.MaxConcurrent)),
		bodies:    semaphore.NewWeighted(inFlightBodyBytes),
		rejectLog: rate.Sometimes{First: 1, Interval: opts.LogInterval}}
}

// Timeout is each request's deadline.
func (in *Intake) Timeout() time.Duration { return in.opts.Timeout }

// Error is a request that cannot be answered: the route answers with the
// HTTP status instead (for an admission webhook the API server then applies
// its failurePolicy; for Gatekeeper's external data, a system error).
type Error struct {
	Code   int
	Reason string // a Reject* constant or the route's own
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// BadRequest is a 400 with the route's reason.
func BadRequest(reason, format string, args ...any) *Error {
	return &Error{Code: http.StatusBadRequest, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Read checks the transport and reads the body under the byte budget; the
// caller runs the returned func once it has answered. clients, when set, is
// the CA the route's clients must present a certificate of.
func (in *Intake) Read(w http.ResponseWriter, r *http.Request, clients *x509.CertPool) ([]byte, func(), *Error) {
	if r.Method != http.MethodPost {
		return nil, nil, &Error{http.StatusMethodNotAllowed, RejectMethod, fmt.Sprintf("method %s not allowed: send the request with POST", r.Method)}
	}
	if clients != nil && !Verified(r, clients) {
		return nil, nil, &Error{http.StatusUnauthorized, RejectClientCert, "a client certificate signed by this route's client CA is required"}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, nil, &Error{http.StatusUnsupportedMediaType, RejectContentType, fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type"))}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, nil, &Error{http.StatusRequestEntityTooLarge, RejectTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
		}
		return nil, nil, BadRequest(RejectRead, "read body: %v", err)
	}
	// Held until the answer is written: the caller releases it.
	ctx, cancel := context.WithTimeout(r.Context(), in.opts.Timeout)
	defer cancel()
	if err := in.bodies.Acquire(ctx, int64(len(body))); err != nil {
		return nil, nil, &Error{http.StatusServiceUnavailable, RejectBusy, "too many large requests at once; retry"}
	}
	n := int64(len(body))
	return body, func() { in.bodies.Release(n) }, nil
}

// Verified reports whether the request's client presented a certificate
// that chains to clients for client authentication. The TLS server asks for
// (and checks) certificates of every route's CA; this tells the routes'
// CAs apart.
func Verified(r *http.Request, clients *x509.CertPool) bool {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return false
	}
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := r.TLS.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: clients, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// Reject answers a request that cannot be answered with its HTTP error,
// counts it and logs it sparingly; what says the route.
func (in *Intake) Reject(w http.ResponseWriter, e *Error, what, route, cluster string) {
	if e.Code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	http.Error(w, "nodeguard: "+e.Msg, e.Code)
	in.opts.Metrics.rejectedRequest(e.Reason)
	// Anything that reaches the port can send these: a line per request
	// would let it flood the logs, so one line per interval says how many.
	in.rejected.Add(1)
	in.rejectLog.Do(func() {
		in.opts.Log.Warn("bad "+what, "route", route, "cluster", cluster, "status", e.Code,
			"reason", e.Reason, "error", e.Msg, "rejectedSinceLastLine", in.rejected.Swap(0))
	})
}

// Do runs work within the request's deadline. Concurrent callers with the
// same key share one run; at most MaxConcurrent run at once, the others
// queue for a slot until their deadline, and then get busy() instead.
// work's context ends a little before the first caller's deadline, so its
// answer can say why rather than race the deadline.
func Do[T any](ctx context.Context, in *Intake, key string, busy func() T, work func(context.Context) T) T {
	ctx, cancel := context.WithTimeout(ctx, in.opts.Timeout)
	defer cancel()
	// Do, not DoChan: the first request's goroutine (a connection's, its
	// stack already grown) does the work; DoChan would start a goroutine per
	// run and regrow a stack to OPA's depth each time (19% of the CPU under
	// load). Waiting needs no select: the shared run ends before any
	// waiter's deadline (below).
	v, _, _ := in.flights.Do(key, func() (any, error) {
		// The first request's deadline bounds the shared run: the requests
		// joining later have later deadlines, so every one of them is still
		// waiting when it ends. The first request's own cancellation (its
		// caller gave up) must not fail the others.
		deadline, _ := ctx.Deadline()
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(-in.opts.Timeout/16))
		defer cancel()
		if err := in.slots.Acquire(fctx, 1); err != nil {
			return busy(), nil
		}
		defer in.slots.Release(1)
		return work(fctx), nil
	})
	return v.(T)
}

// Metrics are what an Intake counts.
type Metrics struct {
	rejected *prometheus.CounterVec
}

// NewMetrics registers nodeguard_rejected_requests_total on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nodeguard_rejected_requests_total",
		Help: "Requests answered with an HTTP error instead of a decision (malformed, wrong method or type, too large, no client certificate), by reason.",
	}, []string{"reason"})}
	if err := reg.Register(m.rejected); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return m, nil
}

// rejectedRequest counts one request answered with an HTTP error; a nil
// Metrics counts nothing.
func (m *Metrics) rejectedRequest(reason string) {
	if m == nil {
		return
	}
	m.rejected.WithLabelValues(reason).Inc()
}
