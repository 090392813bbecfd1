package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/admission"
)

// The CA bundle the workload clusters are given is every certificate of
// every CA file, each once, in a stable order. A CA rotation lists both CAs
// for as long as the files differ (the serving Secret's ca.crt names the CA
// that signed the serving certificate today, the CA Secret's tls.crt the one
// that signs it next), so no API server holds a bundle that rejects the
// serving certificate at any moment of it.

// joinCerts is the bundle of certs (PEM), sorted, each once.
func joinCerts(certs [][]byte) []byte {
	certs = slices.Clone(certs)
	slices.SortFunc(certs, bytes.Compare)
	return bytes.Join(slices.CompactFunc(certs, bytes.Equal), nil)
}

// readCerts is every certificate of files, as PEM.
func readCerts(files []string) ([][]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("no CA file: the workload API servers must trust nodeguard's serving certificate")
	}
	var certs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		in, err := admission.Certificates(b)
		if err != nil {
			return nil, fmt.Errorf("CA file %s: %w", f, err)
		}
		certs = append(certs, in...)
	}
	return certs, nil
}

// retainer keeps a certificate that left the CA files in the bundle for a
// while: with several replicas, each serves the certificate of its own copy
// of the Secret, and kubelet updates those copies up to a minute apart, so
// the CA of the serving certificate the slowest replica still serves stays
// trusted until it, too, serves the new one.
type retainer struct {
	keep    time.Duration
	current [][]byte
	retired map[string]time.Time // PEM -> when it left the files
}

// bundle takes the certificates in the files now and returns the bundle to
// write: those and the ones retired within keep.
func (r *retainer) bundle(now time.Time, certs [][]byte) []byte {
	if r.retired == nil {
		r.retired = map[string]time.Time{}
	}
	in := map[string]bool{}
	for _, c := range certs {
		in[string(c)] = true
		delete(r.retired, string(c))
	}
	for _, c := range r.current {
		if !in[string(c)] {
			if _, ok := r.retired[string(c)]; !ok {
				r.retired[string(c)] = now
			}
		}
	}
	r.current = slices.Clone(certs)
	all := slices.Clone(certs)
	for c, since := range r.retired {
		if !now.Before(since.Add(r.keep)) {
			delete(r.retired, c)
			continue
		}
		all = append(all, []byte(c))
	}
	return joinCerts(all)
}
