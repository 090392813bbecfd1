package fleet

import (
	"context"
	"sync"
)

// warningCollector hands each warning of a response to the list the
// request's context carries: one client serves every proof of a cluster,
// and each proof reads only its own answer's warnings.
type warningCollector struct{}

type warningsKey struct{}

type warningList struct {
	mu  sync.Mutex
	out *[]string
}

func withWarnings(ctx context.Context, out *[]string) context.Context {
	return context.WithValue(ctx, warningsKey{}, &warningList{out: out})
}

func (warningCollector) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, text string) {
	l, ok := ctx.Value(warningsKey{}).(*warningList)
	if !ok || code != 299 {
		return
	}
	l.mu.Lock()
	*l.out = append(*l.out, text)
	l.mu.Unlock()
}
