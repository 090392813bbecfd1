// Package testlog is a log a test reads while the code under test writes it.
package testlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
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
