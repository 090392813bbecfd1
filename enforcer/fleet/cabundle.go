package fleet

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
)

// CABundle reads the CA bundle the workload clusters are given: every
// certificate of every file, each once, in a stable order. A CA rotation
// lists both CAs for as long as both files differ (the serving Secret's
// ca.crt names the CA that signed the serving certificate today, the CA
// Secret's tls.crt the one that signs it next), so no API server holds a
// bundle that rejects the serving certificate at any moment of it.
func CABundle(files []string) ([]byte, error) {
	if len(files) == 0 {
		return nil, errors.New("no CA file: the workload API servers must trust nodeguard's serving certificate")
	}
	var certs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		n := 0
		for {
			var block *pem.Block
			block, b = pem.Decode(b)
			if block == nil {
				break
			}
			if block.Type != "CERTIFICATE" {
				continue
			}
			if _, err := x509.ParseCertificate(block.Bytes); err != nil {
				return nil, fmt.Errorf("CA file %s: %w", f, err)
			}
			certs = append(certs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}))
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", f)
		}
	}
	slices.SortFunc(certs, bytes.Compare)
	return bytes.Join(slices.CompactFunc(certs, bytes.Equal), nil), nil
}
