// Package testlog is a log a test reads while the code under test writes it.
package testlog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Buffer is a bytes.Buffer safe for one writer and readers at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// JSON is a JSON logger writing into a new Buffer.
func JSON() (*slog.Logger, *Buffer) {
	b := &Buffer{}
	return slog.New(slog.NewJSONHandler(b, nil)), b
}

// Lines decodes what was written as JSON lines, one object each; a line
// that is not one is an error.
func (l *Buffer) Lines() ([]map[string]any, error) {
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace([]byte(l.String())), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// LinesAfter has stop end the writer (within 5 s: an asynchronous log, such
// as the decision log's console, flushes when it stops) and decodes what
// it wrote (Lines).
func (l *Buffer) LinesAfter(t testing.TB, stop func(context.Context)) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stop(ctx)
	lines, err := l.Lines()
	require.NoError(t, err)
	return lines
}
