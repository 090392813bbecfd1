// This file serves HTTPS for the review and external data port: a
// certificate reloaded when its files change, TLS settings named as
// Kubernetes names them, optional client certificates, bounded connections
// and HTTP/2 streams, and a graceful shutdown.

package admission

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	cliflag "k8s.io/component-base/cli/flag"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// DefaultMinVersion and DefaultCipherSuites are the defaults of
// --tls-min-version and --tls-cipher-suites: TLS 1.2 with forward-secret AEAD
// suites only (no CBC, no RSA key exchange). TLS 1.3 suites are all AEAD and
// Go does not let them be chosen.
const DefaultMinVersion = "VersionTLS12"

// DefaultCipherSuites are named as the API server's --tls-cipher-suites
// names them.
func DefaultCipherSuites() []string {
	return []string{
		"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
		"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
		"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
		"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
		"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
		"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
	}
}

// TLSOptions are the server's certificate files and TLS settings.
type TLSOptions struct {
	CertFile, KeyFile string
	// ClientCAFiles, when set, make the server ask for client certificates
	// signed by one of them; each route checks its own CA (see
	// WebhookOptions.ClientCAs and Verified).
	ClientCAFiles []string
	// WatchInterval is how often the files are re-read besides file events
	// (default: certwatcher's).
	WatchInterval time.Duration
	// MinVersion is the lowest TLS version accepted, as Kubernetes names it
	// (VersionTLS12, VersionTLS13; default DefaultMinVersion).
	MinVersion string
	// CipherSuites are the TLS 1.2 suites accepted, by IANA name (default
	// DefaultCipherSuites).
	CipherSuites []string
}

// MaxStreamsPerConnection bounds an HTTP/2 connection's concurrent requests.
const MaxStreamsPerConnection = 64

// LoadCAs reads PEM CA certificates from files into one pool.
func LoadCAs(files ...string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	for _, f := range files {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read client CA: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s: no PEM certificates", f)
		}
	}
	return pool, nil
}

// TLSServer is the HTTPS server; its certificate is reloaded when the files
// change.
type TLSServer struct {
	http    *http.Server
	watcher *certwatcher.CertWatcher
	log     *slog.Logger
}

// NewTLSServer loads the certificate and builds the server; nothing listens yet.
func NewTLSServer(handler http.Handler, opts TLSOptions, log *slog.Logger) (*TLSServer, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, errors.New("--tls-cert-file and --tls-private-key-file are required: the API server only calls webhooks over HTTPS")
	}
	watcher, err := certwatcher.New(opts.CertFile, opts.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	if opts.WatchInterval > 0 {
		watcher = watcher.WithWatchInterval(opts.WatchInterval)
	}
	minName := cmp.Or(opts.MinVersion, DefaultMinVersion)
	minVersion, err := cliflag.TLSVersion(minName)
	if err != nil {
		return nil, fmt.Errorf("--tls-min-version: %w", err)
	}
	if minVersion < tls.VersionTLS12 {
		return nil, fmt.Errorf("--tls-min-version %s: want VersionTLS12 or later", minName)
	}
	names := opts.CipherSuites
	if len(names) == 0 {
		names = DefaultCipherSuites()
	}
	suites, err := cliflag.TLSCipherSuites(names)
	if err != nil {
		return nil, fmt.Errorf("--tls-cipher-suites: %w", err)
	}
	cfg := &tls.Config{MinVersion: minVersion, CipherSuites: suites, GetCertificate: watcher.GetCertificate}
	if len(opts.ClientCAFiles) > 0 {
		pool, err := LoadCAs(opts.ClientCAFiles...)
		if err != nil {
			return nil, err
		}
		// A client without a certificate still gets an HTTP answer (401)
		// that says what is missing, rather than a failed handshake.
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	return &TLSServer{
		http: &http.Server{
			Handler:           handler,
			TLSConfig:         cfg,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       90 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			// HTTP/2 buffers a stream's DATA before the handler reads it, up
			// to the flow-control windows: small windows, and a bounded
			// number of streams, keep a connection's share of memory small
			// while its requests wait for the byte budget.
			HTTP2: &http.HTTP2Config{
				MaxConcurrentStreams:          MaxStreamsPerConnection,
				MaxReceiveBufferPerConnection: 256 << 10,
				MaxReceiveBufferPerStream:     64 << 10,
			},
		},
		watcher: watcher,
		log:     log,
	}, nil
}

// Serve answers on l until ctx is done, then drains in-flight reviews for up
// to grace before returning.
func (s *TLSServer) Serve(ctx context.Context, l net.Listener, grace time.Duration) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		if err := s.watcher.Start(watchCtx); err != nil {
			s.log.Error("certificate watcher stopped", "error", err)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- s.http.ServeTLS(newLimitListener(l, MaxConnections, MaxConnectionsPerClient), "", "") }()
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down", "grace", grace)
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
