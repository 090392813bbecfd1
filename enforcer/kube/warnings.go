package kube

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/client-go/rest"
)

// maxDistinctWarnings bounds the warnings remembered for deduplication; past
// it, each further new one is logged every time it comes.
const maxDistinctWarnings = 1024

// LogWarnings writes the API server's warnings ("v1beta2 DockerMachine is
// deprecated", on every request that reads one) to log, each distinct one
// once, instead of client-go's plain text on stderr, which would break a JSON
// log.
func LogWarnings(log *slog.Logger) rest.WarningHandlerWithContext {
	return &warningLog{log: log, seen: map[string]bool{}}
}

type warningLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	seen map[string]bool
}

func (w *warningLog) HandleWarningHeaderWithContext(ctx context.Context, code int, agent, message string) {
	if code != 299 || message == "" {
		return
	}
	w.mu.Lock()
	seen := w.seen[message]
	if !seen && len(w.seen) < maxDistinctWarnings {
		w.seen[message] = true
	}
	w.mu.Unlock()
	if !seen {
		w.log.WarnContext(ctx, "API server warning", "warning", message)
	}
}
