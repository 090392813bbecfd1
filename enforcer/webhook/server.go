package webhook

import (
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

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// TLSOptions are the server's certificate files.
type TLSOptions struct {
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the server ask for client certificates
	// signed by it; the review routes then require one (see
	// Options.RequireClientCert), the probes do not.
	ClientCAFile string
	// WatchInterval is how often the files are re-read besides file events
	// (default: certwatcher's).
	WatchInterval time.Duration
}

// Server is the HTTPS server; its certificate is reloaded when the files
// change.
type Server struct {
	http    *http.Server
	watcher *certwatcher.CertWatcher
	log     *slog.Logger
}

// NewServer loads the certificate and builds the server; nothing listens yet.
func NewServer(handler http.Handler, opts TLSOptions, log *slog.Logger) (*Server, error) {
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
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: watcher.GetCertificate}
	if opts.ClientCAFile != "" {
		pem, err := os.ReadFile(opts.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s: no PEM certificates", opts.ClientCAFile)
		}
		// Probes come without a certificate; review routes check for one.
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		http: &http.Server{
			Handler:           handler,
			TLSConfig:         cfg,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       90 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		},
		watcher: watcher,
		log:     log,
	}, nil
}

// Serve answers on l until ctx is done, then drains in-flight reviews for up
// to grace before returning.
func (s *Server) Serve(ctx context.Context, l net.Listener, grace time.Duration) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		if err := s.watcher.Start(watchCtx); err != nil {
			s.log.Error("certificate watcher stopped", "error", err)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- s.http.ServeTLS(l, "", "") }()
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
