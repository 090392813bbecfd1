// This file serves nodeguard's health probes: /healthz (the process
// answers) and /readyz (every needed informer has synced), on a port of their
// own that a NetworkPolicy can keep from the API server's callers.

package admission

import (
	"io"
	"net/http"
)

// ProbeHandler returns /healthz and /readyz; ready reports why the process is not
// ready, nil when it is (nil ready: always ready).
func ProbeHandler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}
