// This file bounds the work nodeguard takes on from its HTTPS routes,
// whatever the route: the bytes of requests being read and answered (a byte
// budget), the work done at once (slots), concurrent requests with the same
// input sharing one piece of work, each request's deadline, and what a
// rejected request costs in logs. The admission review routes and the
// external data routes share one Intake, so together they stay within one
// budget.

package admission

import (
	"cmp"
	"context"
	"crypto/x509"
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

	"github.com/nodeguard/nodeguard/enforcer/metrics"
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

// SmallBytes is the size up to which a request takes the small lane of the
// byte budget: every real Node DELETE review (a Node with kubelet's 50
// images, its labels, conditions and managed fields is ~20 KiB:
// webhook's TestRealNodeReviewsTakeTheSmallLane) and every Gatekeeper
// external data request (one key of a few hundred bytes) fits, with room.
const SmallBytes = 64 << 10

// The byte budget: the request bytes being decoded and answered at once,
// taken before the first byte is read, so memory is bounded by it whatever
// the number of connections. Requests up to SmallBytes have a lane of their
// own (small reviews never wait behind large ones: ~100 real reviews of
// 20 KiB fit, 32 of the largest small); larger ones (a Node with the API
// server's 256 KiB of annotations is ~300 KiB; forged ones reach the 1 MiB
// limit) share theirs, ~1 MiB ones four at a time, and are shed first:
// when time runs out they are the ones still waiting. A small request also
// borrows from the large lane when it is free, never waiting there.
const (
	smallLaneBytes = 2 << 20
	largeLaneBytes = 4 * MaxBodyBytes
)

// UnknownLengthBytes is what a request without Content-Length may send: the
// budget is taken before reading, so the length must be known or small. The
// API server and Gatekeeper always send it.
const UnknownLengthBytes = 16 << 10

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
	RejectNoLength    = "no-length"
	RejectRead        = "read"
	RejectBusy        = "busy" // large requests waited past the deadline
)

// IntakeOptions configure an Intake.
type IntakeOptions struct {
	// Timeout is each request's deadline (default 4s).
	Timeout time.Duration
	// MaxConcurrent bounds the work done at once; the others wait within
	// their deadline (default DefaultMaxConcurrent).
	MaxConcurrent int
	Metrics       *IntakeMetrics
	Log           *slog.Logger
	// LogInterval is the least time between two log lines about rejected
	// requests (default 1s); the lines between are counted, not written.
	LogInterval time.Duration
}

// Intake is safe for concurrent use.
type Intake struct {
	opts IntakeOptions
	// slots bounds concurrent work; its waiters are served in order.
	slots *semaphore.Weighted
	// small and large are the byte budget's lanes.
	small, large *semaphore.Weighted
	// flights lets concurrent requests with the same input share one piece
	// of work. It holds a result only while it is being made: a request
	// arriving after it was answered makes its own.
	flights singleflight.Group
	// rejectLog writes at most one line per LogInterval; rejected counts
	// the rejections since the last line.
	rejectLog rate.Sometimes
	rejected  atomic.Int64
}

// NewIntake returns an Intake.
func NewIntake(opts IntakeOptions) *Intake {
	opts.Timeout = cmp.Or(opts.Timeout, 4*time.Second)
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if opts.LogInterval <= 0 {
		opts.LogInterval = time.Second
	}
	return &Intake{opts: opts, slots: semaphore.NewWeighted(int64(opts.MaxConcurrent)),
		small: semaphore.NewWeighted(smallLaneBytes), large: semaphore.NewWeighted(largeLaneBytes),
		rejectLog: rate.Sometimes{First: 1, Interval: opts.LogInterval}}
}

// Timeout is each request's deadline.
func (in *Intake) Timeout() time.Duration { return in.opts.Timeout }

// IntakeError is a request that cannot be answered: the route answers with the
// HTTP status instead (for an admission webhook the API server then applies
// its failurePolicy; for Gatekeeper's external data, a system error).
type IntakeError struct {
	Code   int
	Reason string // a Reject* constant or the route's own
	Msg    string
}

func (e *IntakeError) Error() string { return e.Msg }

// BadRequest is a 400 with the route's reason.
func BadRequest(reason, format string, args ...any) *IntakeError {
	return &IntakeError{Code: http.StatusBadRequest, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// Read checks the transport, takes the byte budget for the body's declared
// length, and only then reads it; the caller runs the returned func once it
// has answered. clients, when set, is the CA the route's clients must
// present a certificate of.
func (in *Intake) Read(w http.ResponseWriter, r *http.Request, clients *x509.CertPool) ([]byte, func(), *IntakeError) {
	if r.Method != http.MethodPost {
		return nil, nil, &IntakeError{http.StatusMethodNotAllowed, RejectMethod, fmt.Sprintf("method %s not allowed: send the request with POST", r.Method)}
	}
	if clients != nil && !Verified(r, clients) {
		return nil, nil, &IntakeError{http.StatusUnauthorized, RejectClientCert, "a client certificate signed by this route's client CA is required"}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, nil, &IntakeError{http.StatusUnsupportedMediaType, RejectContentType, fmt.Sprintf("content type %q not supported: want application/json", r.Header.Get("Content-Type"))}
	}
	n, known := r.ContentLength, r.ContentLength >= 0
	switch {
	case n > MaxBodyBytes:
		return nil, nil, &IntakeError{http.StatusRequestEntityTooLarge, RejectTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
	case !known:
		n = UnknownLengthBytes
	}
	ctx, cancel := context.WithTimeout(r.Context(), in.opts.Timeout)
	defer cancel()
	release, ok := in.acquire(ctx, n)
	if !ok {
		return nil, nil, &IntakeError{http.StatusServiceUnavailable, RejectBusy, "too many large requests at once; retry"}
	}
	// One byte more than the budget tells a body longer than it said.
	body, err := io.ReadAll(io.LimitReader(r.Body, n+1))
	var herr *IntakeError
	switch {
	case err != nil:
		herr = BadRequest(RejectRead, "read body: %v", err)
	case int64(len(body)) > n && !known:
		herr = &IntakeError{http.StatusLengthRequired, RejectNoLength, fmt.Sprintf("a body over %d bytes needs a Content-Length", UnknownLengthBytes)}
	case known && int64(len(body)) != n:
		herr = BadRequest(RejectRead, "read body: %d bytes, Content-Length said %d", len(body), n)
	default:
		return body, release, nil
	}
	release()
	return nil, nil, herr
}

// acquire takes n bytes of the budget: from the small lane (or, without
// waiting, the large one) for a small request, from the large lane for a
// large one; false when ctx ends first.
func (in *Intake) acquire(ctx context.Context, n int64) (func(), bool) {
	if n <= SmallBytes && in.large.TryAcquire(n) {
		return func() { in.large.Release(n) }, true
	}
	lane := in.large
	if n <= SmallBytes {
		lane = in.small
	}
	if err := lane.Acquire(ctx, n); err != nil {
		return nil, false
	}
	return func() { lane.Release(n) }, true
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
func (in *Intake) Reject(w http.ResponseWriter, e *IntakeError, what, route, cluster string) {
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

// IntakeMetrics are what an Intake counts.
type IntakeMetrics struct {
	rejected *prometheus.CounterVec
}

// NewIntakeMetrics registers nodeguard_rejected_requests_total on reg.
func NewIntakeMetrics(reg prometheus.Registerer) (*IntakeMetrics, error) {
	r := metrics.New(reg)
	m := &IntakeMetrics{rejected: r.CounterVec("nodeguard_rejected_requests_total",
		"Requests answered with an HTTP error instead of a decision (malformed, wrong method or type, too large, no client certificate), by reason.", "reason")}
	if err := r.Err("intake metrics"); err != nil {
		return nil, err
	}
	return m, nil
}

// rejectedRequest counts one request answered with an HTTP error; a nil
// Metrics counts nothing.
func (m *IntakeMetrics) rejectedRequest(reason string) {
	if m == nil {
		return
	}
	m.rejected.WithLabelValues(reason).Inc()
}
